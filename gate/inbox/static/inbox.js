// hitl-gate inbox: passkey sign-in and signed decisions, live updates.
// Plain JavaScript, no build step; everything behind feature checks: without it the
// pages still read, and forms post as plain HTML forms.
'use strict';
(function () {
  const b64urlToBytes = (text) => {
    const b64 = text.replace(/-/g, '+').replace(/_/g, '/') + '==='.slice((text.length + 3) % 4);
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  };
  const bytesToB64url = (buffer) => {
    const bytes = new Uint8Array(buffer);
    let text = '';
    for (let i = 0; i < bytes.length; i += 1) text += String.fromCharCode(bytes[i]);
    return btoa(text).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
  };
  // what a button did or the page learned: the item page's notice pinned at the top of the
  // window (focused when it answers a button), else the live region pinned at the bottom
  // (a form's own status line, beside its button, when it has one: it covers nothing);
  // ``text`` a string, or a list of strings and nodes (a link)
  const say = (text, focus, form) => {
    const own = form ? form.querySelector('.form-status') : null;
    const live = own || document.getElementById('sign-status') || document.getElementById('live');
    if (!live) return;
    if (Array.isArray(text)) live.replaceChildren(...text); else live.textContent = text;
    if (focus && live.tabIndex === -1) live.focus();
    // in the page's flow (beside its button): its whole text in view, not only its top
    if (focus && own && own.scrollIntoView) own.scrollIntoView({block: 'nearest'});
  };
  // an item that changed, closed or was decided already: every decision button off at once
  let locked = false;
  const lock = () => {
    locked = true;
    document.querySelectorAll('form[data-sign] button').forEach((b) => { b.disabled = true; });
  };
  const LOCKING = ['changed', 'not_pending', 'already_decided'];
  const failure = (message, reason) => {
    const error = new Error(message);
    error.reason = typeof reason === 'string' ? reason : '';
    return error;
  };
  // the answer to a signed post never came back from the inbox (a balancer's own error
  // page when a replica died, a dropped connection): it may have recorded the decision
  const LOST = 'answer_lost';
  const lost = (status) => {
    const error = failure('the answer was lost', LOST);
    error.status = status;
    return error;
  };
  const lostWords = (form, status) => {
    const why = status ? 'the server answered ' + status + ' instead of the inbox'
      : 'the connection broke';
    if (form.dataset.sign === 'signin') {
      return 'The answer was lost (' + why + '). Reload the page to try again.';
    }
    const what = form.dataset.sign === 'bulk' ? 'your approvals' : 'your decision';
    const recent = document.createElement('a');
    recent.href = '/recent';
    recent.textContent = 'Recent decisions';
    return ['The answer was lost (' + why + '): ' + what + ' may or may not be recorded. See ',
      recent, ' for what the gate recorded before deciding again.'];
  };
  const fields = (form) => {
    const out = {};
    new FormData(form).forEach((value, key) => { out[key] = String(value); });
    return out;
  };
  const postJson = async (url, csrf, body) => {
    const answer = await fetch(url, {
      method: 'POST', credentials: 'same-origin', redirect: 'follow',
      headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf},
      body: JSON.stringify(body),
    });
    return answer;
  };

  // the inbox's refusal sentence (JSON "message"), else its status
  const refusal = async (answer) => {
    try {
      const body = await answer.json();
      if (body && typeof body.message === 'string' && body.message) {
        return failure(body.message, body.reason);
      }
    } catch (error) { /* not JSON: say the status */ }
    return failure('the inbox answered ' + answer.status, '');
  };
  const sentence = (text) => text.replace(/[.\s]+$/, '') + '.';
  // what the browser's WebAuthn error means, in words: never its own text (a W3C URL)
  const PASSKEY = {
    NotAllowedError: 'No passkey was used: it was cancelled, timed out, or this device holds no'
      + ' passkey for the inbox. Use the device you enrolled on, or ask for a new invite.',
    SecurityError: 'This browser refused the passkey at this address: open the inbox at the'
      + ' address your administrator gave you.',
    AbortError: 'No passkey was used: the request was stopped.',
    InvalidStateError: 'No passkey was used: this authenticator cannot sign in here.',
  };
  const browserWords = (error) => PASSKEY[error.name]
    || 'No passkey was used: this browser could not ask for one.';
  const fromBrowser = (error) => typeof DOMException !== 'undefined' && error instanceof DOMException;

  const canSign = () => 'PublicKeyCredential' in window && navigator.credentials
    && typeof navigator.credentials.get === 'function' && 'fetch' in window;

  async function sign(form) {
    const data = fields(form);
    let challenge = form.dataset.challenge || '';
    if (!challenge && form.dataset.challengeUrl) {
      const got = await postJson(form.dataset.challengeUrl, data.csrf || '', data);
      if (!got.ok) throw await refusal(got);
      challenge = (await got.json()).challenge || '';
    }
    if (!challenge) throw new Error('no challenge to sign');
    const credential = await navigator.credentials.get({publicKey: {
      challenge: b64urlToBytes(challenge), userVerification: 'required', timeout: 120000,
    }});
    const r = credential.response;
    data.assertion = {
      type: 'webauthn', credential_id: bytesToB64url(credential.rawId),
      authenticator_data: bytesToB64url(r.authenticatorData),
      client_data_json: bytesToB64url(r.clientDataJSON),
      signature: bytesToB64url(r.signature),
      user_handle: r.userHandle ? bytesToB64url(r.userHandle) : null,
    };
    let answer;
    try {
      answer = await postJson(form.action, data.csrf || '', data);
    } catch (error) {
      throw lost(0);  // sent, maybe received: the connection broke before the answer
    }
    const type = answer.headers.get('Content-Type') || '';
    if (type.indexOf('application/json') === 0) {
      let body;
      try { body = await answer.json(); } catch (error) { throw lost(answer.status); }
      if (body.location) { window.location.assign(body.location); return; }
      throw failure(body.message || body.reason || ('answer ' + answer.status), body.reason);
    }
    // a page the inbox redirected to; anything else is not the inbox's answer
    if (answer.ok && answer.redirected) { window.location.assign(answer.url); return; }
    throw lost(answer.status);
  }

  function setUpSigning() {
    const forms = document.querySelectorAll('form[data-sign]');
    if (forms.length === 0) return;
    if (!canSign()) {
      say('This browser cannot use passkeys here; use one that supports them.');
      return;
    }
    forms.forEach((form) => {
      form.addEventListener('submit', (event) => {
        event.preventDefault();
        if (!form.reportValidity()) return;
        const button = form.querySelector('button[type="submit"]');
        if (button) button.disabled = true;
        say('Waiting for your passkey…', true, form);
        sign(form).catch((error) => {
          if (error && fromBrowser(error)) {  // nothing reached the inbox: the button works again
            say(browserWords(error) + ' Nothing was sent.', true, form);
            return;
          }
          if (error && error.reason === LOST) { say(lostWords(form, error.status), true, form); return; }
          // the inbox used the page's sign-in challenge up: a new page brings a new one
          const again = form.dataset.sign === 'signin' ? ' Reload the page to try again.' : '';
          if (error && LOCKING.indexOf(error.reason) >= 0) lock();
          say('Not sent: ' + sentence(error && error.message ? error.message : 'the passkey was not used') + again, true, form);
        }).finally(() => { if (button && !locked) button.disabled = false; });
      });
      // a result about the selection goes away once the selection changes
      form.addEventListener('change', () => {
        const own = form.querySelector('.form-status');
        if (own) own.textContent = '';
      });
    });
  }

  function setUpLive() {
    const marker = document.querySelector('[data-live-seq]');
    if (!marker || !('fetch' in window)) return;
    let seq = Number(marker.dataset.liveSeq) || 0;
    const page = document.querySelector('article[data-approval-id]');
    const apply = (change) => {
      const [id, state] = change;
      if (page && page.dataset.approvalId === id) {
        lock();
        if (state === 'pending') { say('This item changed: reload the page to see the new revision.'); return; }
        // closed: the state at the top, the forms hidden, time left says so
        const top = document.getElementById('item-state');
        const now = 'This item is now ' + state + '; nothing is left to do.';
        if (top) { top.textContent = now; top.hidden = false; }
        say(now);
        page.querySelectorAll('section.forms, form').forEach((f) => { f.hidden = true; });
        const left = page.querySelector('.facts .left dd');
        if (left) left.textContent = state;
        return;
      }
      let known = false;
      document.querySelectorAll('li[data-approval-id]').forEach((row) => {
        if (row.dataset.approvalId !== id) return;
        known = true;
        if (state === 'pending') { row.classList.add('changed'); return; }
        if (row.classList.contains('gone')) return;
        // closed: the row becomes one line of text, no link, no checkbox
        const what = row.querySelector('.what');
        const text = (what ? what.textContent.trim() : 'An item') + ': '
          + (state === 'resolved' ? 'resolved elsewhere' : state) + '.';
        row.classList.add('gone');
        row.textContent = text;
        say(text);
      });
      if (!known && !page && state === 'pending') say('A new item is waiting — reload the page to see it.');
    };
    // an open approval's quorum progress: count and who, as the inbox knows them
    const progress = (p) => {
      if (!page || !p || p.approval_id !== page.dataset.approvalId) return;
      if (String(p.revision) !== page.dataset.revision) return;
      const count = document.querySelector('#quorum-progress dd');
      if (count && typeof p.quorum === 'string' && count.textContent !== p.quorum) {
        count.textContent = p.quorum;
        say('Approvals: ' + p.quorum + '.');
      }
      const who = document.getElementById('approved-by');
      const names = Array.isArray(p.approved_by) ? p.approved_by.map(String) : [];
      if (who && who.querySelector('dd')) {
        who.querySelector('dd').textContent = names.join(', ');
        who.hidden = names.length === 0;
      }
    };
    const url = () => '/live?since=' + encodeURIComponent(seq)
      + (page ? '&item=' + encodeURIComponent(page.dataset.approvalId) : '');
    const poll = async () => {
      try {
        const answer = await fetch(url(), {credentials: 'same-origin'});
        if (answer.status === 401) {  // a revoked passkey says so at once, not at the next page
          const why = await refusal(answer);
          lock();
          say(why.reason === 'passkey_revoked' ? why.message
            : 'You are signed out: reload the page to sign in again.', true);
          return;
        }
        if (answer.ok) {
          const body = await answer.json();
          progress(body.progress);
          (body.changed || []).forEach(apply);
          if (typeof body.seq === 'number') seq = body.seq;
        }
      } catch (error) { /* offline: try again at the next tick */ }
      window.setTimeout(poll, 5000);
    };
    window.setTimeout(poll, 5000);
  }

  document.addEventListener('DOMContentLoaded', () => { setUpSigning(); setUpLive(); });
}());
