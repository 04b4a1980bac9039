// hitl-gate passkey enrolment (issue 16): read the registration options from the page's JSON
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

function show(text, kind) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = kind;
}

async function enrol() {
  const button = document.getElementById("create");
  button.disabled = true;
  const options = JSON.parse(document.getElementById("options").textContent);
  options.challenge = fromB64url(options.challenge);
  options.user.id = fromB64url(options.user.id);
  options.excludeCredentials = (options.excludeCredentials || []).map(
    (c) => Object.assign({}, c, { id: fromB64url(c.id) }));
  let credential;
  try {
    credential = await navigator.credentials.create({ publicKey: options });
  } catch (err) {
    show("No passkey was created: " + err.name, "error");
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
  const answer = await fetch(window.location.pathname, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
    credentials: "omit",
  });
  const result = await answer.json().catch(() => ({}));
  if (answer.ok) {
    document.getElementById("create").remove();
    document.querySelector("h1").textContent = "Passkey enrolled";
    const who = document.querySelector("main p strong");
    const lead = document.querySelector("main p");
    if (lead && who) lead.textContent = "Decisions as " + who.textContent +
      " can now be signed with this passkey (credential " + result.credential_id + ").";
    show("Passkey enrolled. You can close this page.", "ok");
  } else {
    show("The gate refused it: " + (result.message || result.reason || answer.status), "error");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const button = document.getElementById("create");
  if (button) button.addEventListener("click", enrol);
});
