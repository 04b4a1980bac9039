// hitl-gate passkey enrolment: read the registration options from the page's JSON
// block, run navigator.credentials.create, post the credential back to this same URL.
"use strict";

function fromB64url(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((text.length + 3) % 4);
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out.buffer;
}

function toB64url(buffer) {
  const bytes = new Uint8Array(buffer);
  let raw = "";
  for (let i = 0; i < bytes.length; i++) raw += String.fromCharCode(bytes[i]);
  return btoa(raw).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const REFUSED = {
  invite_expired: "This invite has expired. Ask for a new one.",
  invite_used: "This invite was used already. Ask for a new one.",
  invite_unknown: "This invite does not exist. Check the link.",
  origin_not_allowed: "Open the link exactly as printed: this page must come from the gate itself.",
  invalid_registration: "The gate could not verify this passkey. Try again, or ask for a new invite.",
  credential_exists: "This passkey is enrolled already: you can sign with it.",
  webauthn_unavailable: "This gate cannot enrol passkeys right now. Tell the person who invited you.",
};
const BROWSER = {
  SecurityError:
    "Open the link exactly as printed (http://localhost:…, not 127.0.0.1): passkeys need the host name the gate was set up with.",
  NotAllowedError:
    "The passkey was not created (cancelled, timed out, or this authenticator cannot verify you).",
  InvalidStateError: "This authenticator holds a passkey for you already.",
};

function show(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = kind;
}

function expiresAt() {
  const time = document.getElementById("expires");
  const at = time ? Date.parse(time.getAttribute("datetime")) : NaN;
  return Number.isNaN(at) ? null : at;
}

function expired() {
  const at = expiresAt();
  return at !== null && Date.now() >= at;
}

async function enrol() {
  const button = document.getElementById("create");
  button.disabled = true;
  if (expired()) {  // never create a passkey the gate will refuse (it would be an orphan)
    button.remove();
    show(REFUSED.invite_expired, "error");
    return;
  }
  const options = JSON.parse(document.getElementById("options").textContent);
  options.challenge = fromB64url(options.challenge);
  options.user.id = fromB64url(options.user.id);
  options.excludeCredentials = (options.excludeCredentials || []).map(
    (c) => Object.assign({}, c, { id: fromB64url(c.id) }));
  let credential;
  try {
    credential = await navigator.credentials.create({ publicKey: options });
  } catch (err) {
    show(BROWSER[err.name] || ("No passkey was created (" + err.name + ")."), "error");
    button.disabled = false;
    return;
  }
  const response = credential.response;
  const body = {
    id: credential.id,
    rawId: toB64url(credential.rawId),
    type: credential.type,
    response: {
      clientDataJSON: toB64url(response.clientDataJSON),
      attestationObject: toB64url(response.attestationObject),
      transports: response.getTransports ? response.getTransports() : [],
    },
    clientExtensionResults: credential.getClientExtensionResults(),
  };
  let answer;
  try {
    answer = await fetch(window.location.pathname.replace(/\/+$/, ""), {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      credentials: "omit",
    });
  } catch (err) {
    show("The gate could not be reached. Check the connection and try again.", "error");
    button.disabled = false;
    return;
  }
  const result = await answer.json().catch(() => ({}));
  if (answer.ok) {
    button.remove();
    const expiry = document.getElementById("expires");
    if (expiry) expiry.parentElement.remove();
    document.querySelector("h1").textContent = "Passkey enrolled";
    const who = document.querySelector("main .identity");
    const lead = document.querySelector("main p");
    if (lead && who) lead.textContent = "Decisions as " + who.textContent +
      " can now be signed with this passkey (credential " + result.credential_id + ").";
    const next = document.getElementById("sign-in-at");
    if (next) next.hidden = false;
    show(next ? "Passkey enrolled." :
      "Passkey enrolled. You can close this page. Your administrator will tell you where to sign in.", "ok");
  } else {
    const words = REFUSED[result.reason];
    show(words || ("The gate refused the passkey (" + (result.reason || answer.status) + ")."),
      "error");
    if (!words || result.reason === "invalid_registration") button.disabled = false;
    else button.remove();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const button = document.getElementById("create");
  if (button) button.addEventListener("click", enrol);
});
