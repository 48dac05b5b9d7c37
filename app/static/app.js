// The test page: log in, devices, recent activity, organizations, live events, rooms. All server calls go
// through the reference client.
import { Client, EventFeed, ServiceError, conditionalMediationAvailable, passkeysSupported } from "./client.js";

const $ = (id) => document.getElementById(id);
const SESSIONS_REFRESH_MS = 3000;
// Join and leave events keep a room's list of people current; a periodic look also catches the rooms
// whose namespace sends none, and people whose server went away (their presence runs out).
const ROOM_PRESENCE_REFRESH_MS = 10_000;
const ACTIVITY_PAGE = 20;
// Where a visitor may be sent here to come back to once signed in: the admin console (GET /admin without a
// session), and an application's sign-in request to this service (GET /oauth/authorize, with its query).
const RETURN_PATHS = new Set(["/admin"]);
const AUTHORIZE_PATH = "/oauth/authorize";
// An application's sign-in request, kept in this tab across a provider login that asks for a second factor.
const NEXT_KEY = "authRt.next";
// A mailed invitation's token, kept in this tab until it is accepted or put aside: across the login it may
// need first (a provider's login comes back to /), and a reload.
const INVITATION_KEY = "authRt.invitation";

const TRANSPORT_NAMES = {
  sse: "server-sent events",
  websocket: "WebSocket",
  "long-poll": "long polling",
  poll: "polling",
};
const STATE_NAMES = { connecting: "Connecting", live: "Live", reconnecting: "Reconnecting", offline: "Offline" };

const UNSUBSCRIBE_REASONS = {
  revoked: "your access to it was revoked",
  expired: "your access to it expired",
  namespace_deleted: "it no longer exists",
  access_changed: "your access to it ended",
};

const client = new Client({ onLoggedOut: () => showSignedOut("You are logged out.") });
const feed = new EventFeed(client, {
  onEvent: showEvent,
  onState: showConnection,
  onJoin: (channel, member) => presenceChanged(channel, member, true),
  onLeave: (channel, member) => presenceChanged(channel, member, false),
  onUnsubscribed: removedFromRoom,
});
let me = null;
let sessionsTimer = null;
let hasPasskeys = false;
let returnTo = null; // where the visitor goes once signed in (the console, or an application's sign-in request)
let reauth = false; // the application asked for a new sign-in, even if someone is signed in here already

// For debugging from the console (and for the browser tests): the client objects, never a token.
window.authRt = { client, feed };

function showConnection(state, transport) {
  const line = $("connection");
  line.dataset.state = state;
  const via = transport && state !== "offline" ? ` (${TRANSPORT_NAMES[transport]})` : "";
  line.textContent = `${STATE_NAMES[state]}${via}`;
}

// The outcome of a link the visitor followed (a verification link), shown apart from the session's
// status line: it is news about the link, true whoever is or is not signed in.
function showNotice(text, outcome) {
  const notice = $("notice");
  notice.textContent = text;
  notice.dataset.outcome = outcome;
  notice.hidden = false;
}

function hideNotice() {
  $("notice").hidden = true;
  $("notice").textContent = "";
}

function showSignedOut(message) {
  me = null;
  hideNotice();
  closeOrg();
  memberEmails.clear();
  feed.stop();
  closeRoom();
  for (const channel of feed.channels) feed.unsubscribe(channel); // stopped: only forgotten
  clearInterval(sessionsTimer);
  $("signed-in").hidden = true;
  $("signed-out").hidden = false;
  $("status").textContent = returnTo ? returnMessage() : message;
  showForm("login-form");
}

function returnMessage() {
  if (!authorizing()) return "Log in as an administrator to open the admin console.";
  return reauth ? "Log in again to continue to the application." : "Log in to continue to the application.";
}

// Whether the visitor came from an application signing them in through this service (OpenID Connect).
function authorizing() {
  return returnTo?.startsWith(`${AUTHORIZE_PATH}?`) ?? false;
}

// The signed-out forms: one at a time.
const SIGNED_OUT_FORMS = ["login-form", "mfa-form", "forgot-form", "reset-form"];
function showForm(id) {
  for (const form of SIGNED_OUT_FORMS) $(form).hidden = form !== id;
  $(id).querySelector("input")?.focus();
  if (id === "login-form") startConditionalPasskey();
  else stopConditionalPasskey();
}

// Passkeys on the log-in form: the button, and the browser's autofill (conditional mediation) while the
// form shows. Only one WebAuthn request may be pending, so the autofill one is aborted before any other
// way of logging in starts, and started again when the form shows again.
let conditionalLogin = null; // the AbortController of the pending autofill request

async function startConditionalPasskey() {
  if (conditionalLogin || !(await conditionalMediationAvailable())) return;
  if (conditionalLogin || me || $("login-form").hidden) return; // things moved on while we asked
  const abort = new AbortController();
  conditionalLogin = abort;
  try {
    const user = await client.loginWithPasskey({ conditional: true, signal: abort.signal, device: deviceName() });
    await showSignedIn(user);
  } catch (error) {
    if (abort.signal.aborted) return; // the visitor logs in otherwise, or the form went away
    // A passkey was chosen and refused: say so. The autofill is offered again when the form next shows;
    // the button works meanwhile. (A refusal of the options themselves, 429, concerns no one here.)
    if (error instanceof ServiceError && error.status !== 429) $("login-error").textContent = passkeyErrorText(error);
  } finally {
    if (conditionalLogin === abort) conditionalLogin = null;
  }
}

function stopConditionalPasskey() {
  conditionalLogin?.abort();
  conditionalLogin = null;
}

async function logInWithPasskey() {
  $("login-error").textContent = "";
  stopConditionalPasskey();
  try {
    const email = $("login-email").value.trim();
    const user = await client.loginWithPasskey({ email: email || undefined, device: deviceName() });
    await showSignedIn(user);
  } catch (error) {
    $("login-error").textContent = passkeyErrorText(error);
    startConditionalPasskey();
  }
}

// What went wrong with a passkey, in words: the service's message, or the browser's refusal explained.
function passkeyErrorText(error) {
  if (error instanceof ServiceError) return error.message;
  if (error?.name === "NotAllowedError") return "No passkey was used: the request was cancelled or timed out.";
  if (error?.name === "InvalidStateError") return "This device already holds a passkey for your account.";
  if (error?.name === "SecurityError") return "Passkeys cannot be used at this address.";
  return error?.message ?? String(error);
}

async function showSignedIn(user) {
  if (authorizing()) return continueToApplication();
  if (returnTo && user.role === "admin") return location.assign(returnTo); // the session is open: go back
  me = user;
  client.loggedIn();
  stopConditionalPasskey();
  hideNotice();
  if (returnTo) showNotice("The admin console is for administrators only.", "failure");
  returnTo = null;
  $("admin-link").hidden = user.role !== "admin";
  $("signed-out").hidden = true;
  $("signed-in").hidden = false;
  $("status").textContent = `Logged in as ${user.email}`;
  showAccount(user);
  loadPasskeys();
  loadConsents();
  loadActivity();
  loadOrgs();
  showInvitation();
  await loadSessions();
  clearInterval(sessionsTimer);
  sessionsTimer = setInterval(loadSessions, SESSIONS_REFRESH_MS);
  feed.start(selectedTransport());
}

function selectedTransport() {
  return document.querySelector('input[name="transport"]:checked').value;
}

async function loadSessions() {
  const response = await client.request("/auth/sessions");
  if (!response.ok) return;
  const { sessions } = await response.json();
  const list = $("sessions");
  list.replaceChildren(
    ...sessions.map((session) => {
      const item = document.createElement("li");
      item.dataset.sessionId = session.id;
      const label = document.createElement("span");
      label.textContent = `${session.device} — last used ${new Date(session.last_used_at).toLocaleString()}`;
      if (session.current) {
        item.classList.add("current");
        label.textContent += " (this device)";
      }
      const end = document.createElement("button");
      end.type = "button";
      end.textContent = "End";
      end.setAttribute("aria-label", `End the session on ${session.device}`);
      end.addEventListener("click", () => endSession(session));
      item.append(label, " ", end);
      return item;
    }),
  );
}

async function endSession(session) {
  const response = await client.request(`/auth/sessions/${encodeURIComponent(session.id)}`, { method: "DELETE" });
  if (response.ok && session.current) showSignedOut("You ended this device's session.");
  else {
    loadSessions();
    loadActivity();
  }
}

// Recent activity: the user's own audit entries (GET /auth/activity), newest first, a page at a time.
let activityNext = null;

const ACTIVITY_TEXTS = {
  "user.registered": () => "Account created",
  "login.succeeded": (details) =>
    `Logged in on ${details.device ?? "a device"}${details.method && details.method !== "password" ? ` (${details.method})` : ""}`,
  "login.failed": () => "A login with your address failed",
  logout: () => "Logged out",
  "session.revoked": (details) => (details.all_sessions ? "Logged out everywhere" : "A device's session was ended"),
  "refresh.reuse_detected": () => "A reused session token was refused, and its session ended",
  "password.changed": () => "Password changed",
  "password.reset": () => "Password reset by a mailed link",
  "email.verified": () => "E-mail address verified",
  "mfa.enabled": () => "Two-factor authentication turned on",
  "mfa.disabled": () => "Two-factor authentication turned off",
  "mfa.reset": () => "Two-factor authentication reset",
  "passkey.added": (details) => `Passkey “${details.name ?? "unnamed"}” added`,
  "passkey.removed": () => "A passkey was removed",
  "role.changed": (details) => `Role changed to ${details.role}`,
  "user.deleted": () => "Account deleted",
  "api_key.created": (details) => `An API key${named(details.name)} was made`,
  "api_key.deleted": (details) => `An API key${named(details.name)} was deleted`,
  "webhook_endpoint.created": () => "A webhook endpoint was added",
  "webhook_endpoint.updated": () => "A webhook endpoint was changed",
  "webhook_endpoint.deleted": () => "A webhook endpoint was deleted",
  "namespace.put": (details) => `The rules of the rooms ${details.namespace ?? ""}:… were set`,
  "namespace.deleted": (details) => `The rooms ${details.namespace ?? ""}:… were closed`,
  "channel.member_added": (details) => `Let into the room ${details.channel ?? ""}${until(details)}`,
  "channel.member_removed": (details) => `No longer let into the room ${details.channel ?? ""}`,
  "issuer.put": (details) => `Sign-ins from ${details.issuer ?? "an identity provider"} were trusted`,
  "issuer.deleted": (details) => `Sign-ins from ${details.issuer ?? "an identity provider"} are no longer trusted`,
  "oauth_client.created": () => "An application was registered",
  "oauth_client.updated": () => "An application's registration was changed",
  "oauth_client.deleted": () => "An application's registration was removed",
  "signing_key.rotated": () => "The service's signing key was replaced",
  "signing_key.retired": () => "An old signing key of the service was retired",
  "users.exported": (details) => `Every account, password hashes included, was exported (${details.users ?? "?"} users)`,
  "consent.granted": (details) => `An application was allowed: ${(details.scopes ?? []).join(", ")}`,
  "consent.withdrawn": () => "An application's consent was withdrawn",
  "org.created": () => "An organization was created",
  "org.updated": () => "An organization was renamed",
  "org.deleted": () => "An organization was deleted",
  "org.member_added": (details) => `Joined an organization${details.role ? ` as ${details.role}` : ""}`,
  "org.member_removed": (details) => (details.left ? "Left an organization" : "Removed from an organization"),
  "org.role_changed": (details) => `Role in an organization changed${details.role ? ` to ${details.role}` : ""}`,
  "org.invitation_created": () => "Invited to an organization",
  "org.invitation_revoked": () => "An invitation to an organization was withdrawn",
  "org.invitation_accepted": () => "Accepted an invitation to an organization",
};

// ` “name”`, for the phrases above (nothing without a name).
function named(name) {
  return typeof name === "string" && name ? ` “${name}”` : "";
}

// How long a room's grant lasts, for the phrase of a grant: its end, or its length.
function until(details) {
  if (details.expires_at) return ` until ${new Date(details.expires_at).toLocaleString()}`;
  if (typeof details.expires_in !== "number") return "";
  const seconds = Math.round(details.expires_in);
  if (seconds < 120) return ` for ${seconds} seconds`;
  if (seconds < 7200) return ` for ${Math.round(seconds / 60)} minutes`;
  return ` for ${Math.round(seconds / 3600)} hours`;
}

// Entries that may mean someone else is trying: marked for the eye.
const ACTIVITY_WARNINGS = new Set(["login.failed", "refresh.reuse_detected", "mfa.reset"]);

function activityText(entry) {
  const text = ACTIVITY_TEXTS[entry.type]?.(entry.details ?? {}) ?? entry.type;
  const { kind, id } = entry.actor;
  // Another user's change shows without an id (the service keeps who for the audit log): an administrator,
  // except in an organization, where its owners and admins act on their members.
  if (kind === "user" && id !== me?.id) return entry.type.startsWith("org.") ? text : `${text} by an administrator`;
  if (kind === "cli") return `${text}, by an administrator on the service's command line`;
  if (kind === "api_key") return `${text} by an API key`;
  return text;
}

function activityItem(entry) {
  const item = document.createElement("li");
  item.dataset.entryId = entry.id;
  item.dataset.type = entry.type;
  if (ACTIVITY_WARNINGS.has(entry.type)) item.dataset.kind = "warning";
  const when = part("time", "when", new Date(entry.at).toLocaleString());
  when.dateTime = entry.at;
  item.append(when, part("span", "what", activityText(entry)));
  if (entry.ip) item.append(" ", part("span", "where", `from ${entry.ip}`));
  return item;
}

async function loadActivity(more = false) {
  if (!me) return;
  $("activity-error").textContent = "";
  let page;
  try {
    page = await client.activity({ before: more ? activityNext : undefined, limit: ACTIVITY_PAGE });
  } catch (error) {
    $("activity-error").textContent = error.message;
    return;
  }
  const items = page.entries.map(activityItem);
  if (more) $("activity-list").append(...items);
  else $("activity-list").replaceChildren(...items);
  activityNext = page.next;
  $("activity-more-button").hidden = !page.next;
  $("activity-empty").hidden = $("activity-list").children.length > 0;
}

function part(tag, className, text) {
  const element = document.createElement(tag);
  element.className = className;
  element.textContent = text;
  return element;
}

function showEvent(event) {
  if (room && event.channel === room.channel) showRoomEvent(event);
  else logEvent(event);
}

function logEvent(event) {
  const item = document.createElement("li");
  item.dataset.eventId = event.id;
  item.dataset.event = event.event;
  const time = part("time", "time", new Date(event.ts).toLocaleTimeString());
  time.dateTime = event.ts;
  item.append(
    time,
    " ",
    part("span", "channel", event.channel),
    " ",
    part("span", "name", event.event),
    " ",
    part("code", "data", JSON.stringify(event.data)),
  );
  $("event-log").prepend(item);
  $("event-empty").hidden = true;
}

function deviceName() {
  const ua = navigator.userAgent;
  const browser = /Edg\//.test(ua) ? "Edge" : /Firefox\//.test(ua) ? "Firefox" : /Chrome\//.test(ua) ? "Chrome"
    : /Safari\//.test(ua) ? "Safari" : "A browser";
  const system = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac OS X/.test(ua) ? "macOS"
    : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "another system";
  return `${browser} on ${system}`;
}

function credentials() {
  const form = $("login-form");
  return { email: form.email.value, password: form.password.value };
}

async function logIn(event) {
  event?.preventDefault();
  $("login-error").textContent = "";
  stopConditionalPasskey();
  try {
    const user = await client.login({ ...credentials(), device: deviceName() });
    $("login-form").password.value = "";
    await showSignedIn(user);
  } catch (error) {
    $("login-form").password.value = "";
    if (error.code === "mfa_required") askForSecondFactor(error.mfaToken);
    else {
      $("login-error").textContent = error.message;
      startConditionalPasskey();
    }
  }
}

// The second step of a login with MFA (after the password, or after an OAuth provider).
let mfaToken = null;
let useRecoveryCode = false;

function askForSecondFactor(token) {
  mfaToken = token;
  setRecoveryMode(false);
  $("mfa-error").textContent = "";
  showForm("mfa-form");
  $("status").textContent = "Enter the code from your authenticator app to finish logging in.";
}

function setRecoveryMode(recovery) {
  useRecoveryCode = recovery;
  $("mfa-code-label").textContent = recovery ? "Recovery code" : "Code from your authenticator app";
  $("mfa-code").inputMode = recovery ? "text" : "numeric";
  $("mfa-recovery-button").textContent = recovery ? "Use the app's code instead" : "Use a recovery code instead";
  $("mfa-code").value = "";
}

async function finishLogin(event) {
  event.preventDefault();
  $("mfa-error").textContent = "";
  const value = $("mfa-code").value.trim();
  try {
    const factor = useRecoveryCode ? { recoveryCode: value } : { code: value };
    const user = await client.loginMfa({ mfaToken, ...factor, device: deviceName() });
    mfaToken = null;
    $("mfa-code").value = "";
    await showSignedIn(user);
  } catch (error) {
    $("mfa-code").value = "";
    if (error.code === "invalid_token") {
      showForm("login-form");
      $("login-error").textContent = "That login attempt has expired. Log in again.";
    } else {
      $("mfa-error").textContent = error.message;
    }
  }
}

async function askForReset(event) {
  event.preventDefault();
  $("forgot-error").textContent = "";
  try {
    await client.forgotPassword($("forgot-email").value);
    $("forgot-message").textContent =
      "If an account has this address, a link to choose a new password is on its way. It works for 30 minutes.";
  } catch (error) {
    $("forgot-error").textContent = error.message;
  }
}

let resetToken = null;

// Whether a reset link's token still sets a password, asked without using it: false when the service says it
// does not, null when it could not say (the form shows then, and setting the password tells).
async function resetLinkWorks(token) {
  if (!token) return false;
  try {
    return await client.checkResetToken(token);
  } catch {
    return null;
  }
}

// A used, expired or replaced reset link: said as the page opens, with the form that mails a new one.
function showUnusableResetLink() {
  resetToken = null;
  showSignedOut("Ask for a new link below, or log in.");
  showNotice(
    "This password-reset link no longer works: it was used already, it expired (a link works for 30 minutes), " +
      "or a newer link replaced it.",
    "failure",
  );
  showForm("forgot-form");
}

async function resetPassword(event) {
  event.preventDefault();
  $("reset-error").textContent = "";
  try {
    await client.resetPassword(resetToken, $("reset-password").value);
    resetToken = null;
    $("reset-password").value = "";
    showForm("login-form");
    $("status").textContent = "Your password is changed, and every device was logged out. Log in with the new one.";
  } catch (error) {
    $("reset-error").textContent = error.message;
  }
}

// The account panel: the address's verification and two-factor authentication.
function showAccount(user) {
  $("email-status").textContent = user.email_verified
    ? `Your address ${user.email} is verified.`
    : `Your address ${user.email} is not verified yet.`;
  $("resend-button").hidden = user.email_verified;
  $("mfa-status").textContent = user.mfa_enabled
    ? "Two-factor authentication is on."
    : "Two-factor authentication is off.";
  $("mfa-setup-button").hidden = user.mfa_enabled;
  $("mfa-disable-form").hidden = !user.mfa_enabled;
  $("mfa-setup-form").hidden = true;
  $("reauth-form").hidden = true;
}

async function resendVerification() {
  try {
    await client.resendVerification();
    $("email-status").textContent =
      `A verification link is on its way to ${me.email}. Any link mailed before it no longer works.`;
  } catch (error) {
    $("email-status").textContent = error.message;
  }
}

async function startMfaSetup() {
  $("recovery").hidden = true;
  try {
    const setup = await client.setupTotp();
    // The QR code is SVG the service drew (no script in it); parsed as SVG, never as HTML.
    const svg = new DOMParser().parseFromString(
      setup.qr_svg.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" '),
      "image/svg+xml",
    ).documentElement;
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "QR code for your authenticator app");
    $("mfa-qr").replaceChildren(document.importNode(svg, true));
    $("mfa-secret").textContent = setup.secret;
    $("mfa-setup-form").hidden = false;
    $("mfa-setup-button").hidden = true;
    $("mfa-setup-code").focus();
  } catch (error) {
    if (error.code === "reauthentication_required") askForPassword(startMfaSetup);
    else $("mfa-status").textContent = error.message;
  }
}

// Changing how the account signs in (MFA, passkeys) needs a recent proof: the password, or a passkey.
// `then` is what was refused, retried once the proof is accepted.
let afterReauthentication = null;

function askForPassword(then) {
  afterReauthentication = then;
  $("reauth-error").textContent = "";
  $("reauth-form").hidden = false;
  $("reauth-passkey-button").hidden = !(passkeysSupported() && hasPasskeys);
  if (then === startMfaSetup) $("mfa-setup-button").hidden = true;
  $("reauth-password").focus();
}

async function reauthenticated() {
  $("reauth-password").value = "";
  $("reauth-form").hidden = true;
  const then = afterReauthentication;
  afterReauthentication = null;
  await then?.();
}

async function reauthenticate(event) {
  event.preventDefault();
  $("reauth-error").textContent = "";
  try {
    await client.reauthenticate($("reauth-password").value);
  } catch (error) {
    $("reauth-error").textContent = error.message;
    return;
  }
  await reauthenticated();
}

async function reauthenticateWithPasskey() {
  $("reauth-error").textContent = "";
  try {
    await client.reauthenticateWithPasskey();
  } catch (error) {
    $("reauth-error").textContent = passkeyErrorText(error);
    return;
  }
  await reauthenticated();
}

// The applications the user let sign them in (OpenID Connect consents): listed, each one withdrawn at will (its
// sessions end with it).
async function loadConsents() {
  $("consents-error").textContent = "";
  let consents;
  try {
    consents = (await client.json("/auth/consents")).consents;
  } catch (error) {
    $("consents-error").textContent = error.message;
    return;
  }
  $("consents-empty").hidden = consents.length > 0;
  $("consents").replaceChildren(...consents.map(consentItem));
}

function consentItem(consent) {
  const item = document.createElement("li");
  item.dataset.clientId = consent.client_id;
  item.append(
    part("span", "consent-name", consent.name),
    part("span", "consent-scopes", ` — ${consent.scopes.join(", ")} `),
    smallButton("Withdraw", `Withdraw what ${consent.name} may do`, () => withdrawConsent(consent)),
  );
  return item;
}

async function withdrawConsent(consent) {
  $("consents-error").textContent = "";
  const path = `/auth/consents/${encodeURIComponent(consent.client_id)}`;
  const response = await client.request(path, { method: "DELETE" });
  if (!response.ok && response.status !== 404) $("consents-error").textContent = "The consent could not be withdrawn.";
  loadConsents();
  loadSessions();
  loadActivity();
}

// The account's passkeys: list, add (named), rename, remove.
async function loadPasskeys() {
  if (!passkeysSupported()) return;
  let passkeys;
  try {
    passkeys = await client.listPasskeys();
  } catch (error) {
    $("passkey-error").textContent = error.message;
    return;
  }
  hasPasskeys = passkeys.length > 0;
  $("passkeys-empty").hidden = hasPasskeys;
  $("passkeys").replaceChildren(...passkeys.map(passkeyItem));
}

function smallButton(text, label, onClick) {
  const element = document.createElement("button");
  element.type = "button";
  element.textContent = text;
  element.setAttribute("aria-label", label);
  element.addEventListener("click", onClick);
  return element;
}

function passkeyItem(passkey) {
  const item = document.createElement("li");
  item.dataset.passkeyId = passkey.id;
  const used = passkey.last_used_at ? `last used ${new Date(passkey.last_used_at).toLocaleString()}` : "not used yet";
  item.append(
    part("span", "passkey-name", passkey.name),
    part("span", "passkey-about", ` — added ${new Date(passkey.created_at).toLocaleDateString()}, ${used} `),
    smallButton("Rename", `Rename the passkey ${passkey.name}`, () => startRename(item, passkey)),
    " ",
    smallButton("Remove", `Remove the passkey ${passkey.name}`, () => removePasskey(passkey)),
  );
  return item;
}

function startRename(item, passkey) {
  const form = document.createElement("form");
  form.className = "passkey-rename";
  form.noValidate = true;
  const input = document.createElement("input");
  input.value = passkey.name;
  input.maxLength = 64;
  input.setAttribute("aria-label", `New name for the passkey ${passkey.name}`);
  const save = document.createElement("button");
  save.type = "submit";
  save.textContent = "Save";
  form.append(input, " ", save, " ", smallButton("Cancel", "Keep the passkey's name", loadPasskeys));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    $("passkey-error").textContent = "";
    $("passkey-message").textContent = "";
    try {
      await client.renamePasskey(passkey.id, input.value.trim());
      await loadPasskeys();
    } catch (error) {
      $("passkey-error").textContent = error.message;
    }
  });
  item.replaceChildren(form);
  input.focus();
}

async function addPasskey(event) {
  event?.preventDefault();
  $("passkey-error").textContent = "";
  $("passkey-message").textContent = "";
  const name = $("passkey-name").value.trim();
  try {
    const passkey = await client.registerPasskey({ name: name || undefined });
    $("passkey-name").value = "";
    $("passkey-message").textContent = `Passkey “${passkey.name}” added: you can log in with it from now on.`;
    await loadPasskeys();
    loadActivity();
  } catch (error) {
    if (error.code === "reauthentication_required") askForPassword(addPasskey);
    else $("passkey-error").textContent = passkeyErrorText(error);
  }
}

async function removePasskey(passkey) {
  $("passkey-error").textContent = "";
  $("passkey-message").textContent = "";
  try {
    await client.deletePasskey(passkey.id);
    $("passkey-message").textContent =
      `Passkey “${passkey.name}” removed. Your device may still offer it: delete it there too.`;
    await loadPasskeys();
    loadActivity();
  } catch (error) {
    $("passkey-error").textContent = error.message;
  }
}

async function confirmMfaSetup(event) {
  event.preventDefault();
  $("mfa-setup-error").textContent = "";
  try {
    const codes = await client.confirmTotp($("mfa-setup-code").value.trim());
    $("mfa-setup-code").value = "";
    $("recovery-codes").replaceChildren(
      ...codes.map((code) => {
        const item = document.createElement("li");
        item.append(part("code", "recovery-code", code));
        return item;
      }),
    );
    $("recovery").hidden = false;
    me = { ...me, mfa_enabled: true };
    showAccount(me);
    loadActivity();
  } catch (error) {
    $("mfa-setup-error").textContent = error.message;
  }
}

async function disableMfa(event) {
  event.preventDefault();
  $("mfa-disable-error").textContent = "";
  const form = $("mfa-disable-form");
  const value = form.code.value.trim();
  const proof = /^[0-9 ]+$/.test(value) ? { code: value } : { recoveryCode: value };
  try {
    await client.disableTotp({ password: form.password.value, ...proof });
    form.password.value = "";
    form.code.value = "";
    $("recovery").hidden = true;
    me = { ...me, mfa_enabled: false };
    showAccount(me);
    loadActivity();
  } catch (error) {
    $("mfa-disable-error").textContent = error.message;
  }
}

// Links in mails and the OAuth second step land on their own paths, with the token in the fragment
// (never sent to a server). Take it, and clear it from the address bar and history.
function tokenFromLink(name) {
  const value = new URLSearchParams(location.hash.slice(1)).get(name);
  history.replaceState(null, "", "/");
  return value;
}

// What the landing path asks for: `{verification: {error}}` (error null when the address is now
// verified), `{reset: true}` (the reset form; the token kept in resetToken), `{mfaToken}`, or `{}`.
async function followLink() {
  const path = location.pathname;
  if (path === "/verify-email") {
    const token = tokenFromLink("token");
    try {
      await client.verifyEmail(token ?? "");
      return { verification: { error: null } };
    } catch (error) {
      return { verification: { error } };
    }
  }
  if (path === "/reset-password") {
    resetToken = tokenFromLink("token");
    return { reset: true };
  }
  if (path === "/login-mfa") {
    const token = tokenFromLink("mfa_token");
    return token ? { mfaToken: token } : {};
  }
  if (path === "/invitation") {
    // Its token comes in the query (the link's own form). Kept in this tab only, and cleared from the
    // address bar and history.
    const token = new URLSearchParams(location.search).get("token");
    history.replaceState(null, "", "/");
    if (token) sessionStorage.setItem(INVITATION_KEY, token);
    return { invitation: Boolean(token) };
  }
  return {};
}

// `/?next=/admin`: the console sent a visitor without a session here; an administrator goes back once signed in.
// `/?next=/oauth/authorize?...`: an application signs its user in through this service; once signed in (by any
// way: password, a second factor, a passkey, another provider), the visitor goes on with that request.
// `&reauth=1`: the application asked for a new sign-in, so the form shows even to someone signed in already.
function takeReturnTo() {
  const asked = new URLSearchParams(location.search);
  if (location.pathname === "/login-mfa") return safeReturn(sessionStorage.getItem(NEXT_KEY)); // a provider's login
  sessionStorage.removeItem(NEXT_KEY);
  if (location.pathname !== "/" || asked.get("next") === null) return null;
  history.replaceState(null, "", `/${location.hash}`);
  const next = safeReturn(asked.get("next"));
  reauth = next !== null && asked.get("reauth") === "1";
  if (next?.startsWith(`${AUTHORIZE_PATH}?`)) sessionStorage.setItem(NEXT_KEY, next);
  return next;
}

// Only our own pages: a path on this origin that is the console or the authorization endpoint, never an open
// redirect (another origin, a scheme, `//host`, a backslash a browser might read as a slash).
function safeReturn(next) {
  if (typeof next !== "string" || !next.startsWith("/") || next.startsWith("//") || next.includes("\\")) return null;
  let url;
  try {
    url = new URL(next, location.origin);
  } catch {
    return null;
  }
  if (url.origin !== location.origin) return null;
  if (RETURN_PATHS.has(url.pathname) && !url.search) return url.pathname;
  return url.pathname === AUTHORIZE_PATH && url.search ? `${url.pathname}${url.search}` : null;
}

// Signed in: on to the application's request, which now finds the session (and asks for consent, or answers).
function continueToApplication() {
  const next = returnTo;
  returnTo = null;
  sessionStorage.removeItem(NEXT_KEY);
  $("status").textContent = "Signed in. Going back to the application…";
  location.assign(next);
}

// Logging in with another provider on the way to an application: the provider's login comes back to its request.
function keepRequestThroughProviders() {
  for (const link of document.querySelectorAll("nav.providers a")) {
    const url = new URL(link.href, location.origin);
    url.searchParams.set("next", returnTo);
    link.href = `${url.pathname}${url.search}`;
  }
}

// After the session is known: what the verification link did, and what the visitor can do next.
function showVerification({ error }, user) {
  if (!error) return showNotice("Your e-mail address is verified. Thank you.", "success");
  const next = !user
    ? "Log in to have a new link mailed to you."
    : user.email_verified
      ? "Your address is verified already."
      : "The button “Mail me a verification link” below sends a new one.";
  showNotice(`This verification link did not work. ${error.message} ${next}`, "failure");
}

async function register() {
  $("login-error").textContent = "";
  try {
    await client.register(credentials());
  } catch (error) {
    $("login-error").textContent = error.message;
    return;
  }
  await logIn();
}

async function publish(event) {
  event.preventDefault();
  const form = $("publish-form");
  try {
    await client.publish(`user:${me.id}`, form.event.value, form.data.value);
    $("publish-error").textContent = "";
    form.data.value = "";
  } catch (error) {
    $("publish-error").textContent = error.message;
  }
}

// Rooms: one named channel at a time, followed by the page's feed. Who is here comes from the channel's
// presence, then from its join and leave events; messages are events named `message`, each with `from`.
// room: {channel, people: Map(user id -> member), loading, buffered: [[member, present]], timer, withoutPresence}
let room = null;

async function joinRoom(event) {
  event.preventDefault();
  const channel = $("room-name").value.trim();
  $("room-error").textContent = "";
  if (room?.channel === channel) return;
  await leaveRoom();
  const joining = { channel, people: new Map(), loading: false, buffered: [], timer: null };
  room = joining;
  $("room-title").textContent = `In ${channel}`;
  $("room-people").replaceChildren();
  $("room-count").textContent = "0";
  $("room-presence-note").hidden = true;
  $("room-messages").replaceChildren();
  $("room-messages-empty").hidden = false;
  $("room-message-error").textContent = "";
  $("room-send-button").disabled = true; // until the service follows the room: nothing said before is lost
  $("room").hidden = false;
  try {
    await feed.subscribe(channel);
  } catch (error) {
    if (room === joining) closeRoom();
    $("room-error").replaceChildren(...joinRefusal(channel, error));
    return;
  }
  if (room !== joining) return;
  $("room-send-button").disabled = false;
  $("room-message").focus();
  await loadPresence(joining);
  if (room === joining && !joining.withoutPresence) {
    joining.timer = setInterval(() => loadPresence(joining), ROOM_PRESENCE_REFRESH_MS);
  }
}

// Why a room cannot be joined, and the way out: the command that makes its namespace, or the one that lets this
// user in (an administrator's, on the service's machine). As text and code parts, for the error line.
const CLI = ".venv/bin/flask --app wsgi";
function joinRefusal(channel, error) {
  const refused = `You cannot join ${channel}: `;
  const namespace = channel.split(":")[0];
  if (error?.status === 404) {
    const rules = "--subscribe authenticated --publish subscribers --presence --join-leave";
    return [
      `${refused}there is no namespace ${namespace}. An administrator makes it, open to every logged-in user, ` +
        "on the service's machine with ",
      part("code", "command", `${CLI} channels namespace-put ${namespace} ${rules}`),
      namespace === "chat" ? "." : " (make run makes the namespace chat: chat:lobby is open to you).",
    ];
  }
  if (error?.status === 403) {
    return [
      `${refused}its namespace lets in only the people given this room. An administrator lets you in with `,
      part("code", "command", `${CLI} channels grant ${channel} ${me?.email ?? "YOUR-ADDRESS"}`),
      " (the room of an organization lets in its members: ask one of its owners to invite you).",
    ];
  }
  return [`${refused}${error.message}`];
}

async function leaveRoom() {
  if (!room) return;
  const { channel } = room;
  closeRoom();
  try {
    await feed.unsubscribe(channel);
  } catch (error) {
    $("room-error").textContent = error.message;
  }
}

function closeRoom() {
  if (room) clearInterval(room.timer);
  room = null;
  $("room").hidden = true;
}

function removedFromRoom(channel, reason) {
  if (room?.channel !== channel) return;
  closeRoom();
  $("room-error").textContent = `You are no longer in ${channel}: ${UNSUBSCRIBE_REASONS[reason] ?? reason}.`;
  if (orgs.some((org) => channel.split(":")[1]?.split(".")[0] === org.id)) loadOrgs(); // a membership changed
}

// Join and leave events that arrive while presence is being asked wait for its answer and then apply in
// order: each says how one user changed, so applied after any snapshot they leave the list right.
async function loadPresence(current) {
  if (current.loading) return;
  current.loading = true;
  let presence = null;
  let failure = null;
  try {
    presence = await client.presence(current.channel);
  } catch (error) {
    failure = error;
  }
  current.loading = false;
  if (room !== current) return;
  const note = $("room-presence-note");
  if (presence) {
    current.people = new Map(presence.users.map((user) => [user.user_id, user]));
    note.hidden = true;
  } else if (failure.status === 404) {
    current.withoutPresence = true; // its namespace keeps none: asking again would only be refused again
    clearInterval(current.timer);
    note.textContent = "This room does not show who is here.";
    note.hidden = false;
  } else {
    note.textContent = failure.message;
    note.hidden = false;
  }
  for (const [member, present] of current.buffered.splice(0)) applyPresence(current, member, present);
  showPeople(current);
}

function presenceChanged(channel, member, present) {
  if (room?.channel !== channel) return;
  if (room.loading) return room.buffered.push([member, present]);
  applyPresence(room, member, present);
  showPeople(room);
}

function applyPresence(current, member, present) {
  if (present) current.people.set(member.user_id, { ...current.people.get(member.user_id), ...member });
  else current.people.delete(member.user_id);
}

// A person as the room shows them: the name their grant gives them, else the address an organization's member
// list showed, else their user id.
function personName(userId) {
  const name = room?.people.get(userId)?.info?.name;
  return typeof name === "string" && name ? name : (memberEmails.get(userId) ?? userId);
}

function showPeople(current) {
  const people = [...current.people.values()].sort((a, b) => a.user_id.localeCompare(b.user_id));
  $("room-count").textContent = String(people.length);
  $("room-people").replaceChildren(
    ...people.map((person) => {
      const item = document.createElement("li");
      item.dataset.userId = person.user_id;
      item.append(part("span", "person", personName(person.user_id)));
      if (person.user_id === me?.id) {
        item.classList.add("me");
        item.append(" (you)");
      }
      return item;
    }),
  );
}

function showRoomEvent(event) {
  if (["presence.join", "presence.leave", "presence.diff"].includes(event.event)) return; // the people list says it
  const item = document.createElement("li");
  item.dataset.eventId = event.id;
  item.dataset.event = event.event;
  const time = part("time", "time", new Date(event.ts).toLocaleTimeString());
  time.dateTime = event.ts;
  item.append(time, " ");
  if (event.from) {
    item.dataset.from = event.from;
    const sender = part("span", "sender", personName(event.from));
    if (event.from === me?.id) sender.classList.add("me");
    item.append(sender, ": ");
  }
  const text = event.event === "message" && typeof event.data?.text === "string" ? event.data.text : null;
  if (text !== null) item.append(part("span", "text", text));
  else item.append(part("span", "name", event.event), " ", part("code", "data", JSON.stringify(event.data)));
  $("room-messages").append(item);
  $("room-messages-empty").hidden = true;
}

async function sendMessage(event) {
  event.preventDefault();
  const input = $("room-message");
  const text = input.value.trim();
  if (!room || !text) return;
  try {
    await feed.publish(room.channel, "message", { text });
    input.value = "";
    $("room-message-error").textContent = "";
  } catch (error) {
    $("room-message-error").textContent = error.message;
  }
}

// Organizations (GET /orgs): each with the user's role in it; the session's active one (POST /auth/org names
// it in the access tokens); one opened at a time with its members, and for its owners and admins its
// invitations.
const ROLE_WORDS = { owner: "owner", admin: "admin", member: "member" };
let orgs = [];
let activeOrgId = null;
let openOrg = null; // the organization shown with its members: {id, name, role, created_at}
const memberEmails = new Map(); // user id -> address, from the member lists shown (to name people in rooms)

function managesMembers(role) {
  return role === "owner" || role === "admin";
}

async function loadOrgs() {
  if (!me) return;
  $("orgs-error").textContent = "";
  try {
    const [list, active] = await Promise.all([client.json("/orgs"), sessionOrgId()]);
    orgs = list.orgs;
    if (active !== undefined) activeOrgId = active;
  } catch (error) {
    $("orgs-error").textContent = error.message;
    return;
  }
  if (activeOrgId && !orgs.some((org) => org.id === activeOrgId)) activeOrgId = null; // no longer a member
  showOrgs();
  if (openOrg) {
    const still = orgs.find((org) => org.id === openOrg.id);
    if (still) showOrg(still);
    else closeOrg();
  }
}

// The session's active organization as the service tells it (undefined when it does not say).
async function sessionOrgId() {
  const status = await client.status();
  return "org_id" in status ? status.org_id : undefined;
}

function showOrgs() {
  $("orgs-empty").hidden = orgs.length > 0;
  $("orgs-list").replaceChildren(...orgs.map(orgItem));
  const active = orgs.find((org) => org.id === activeOrgId);
  $("org-active").textContent = active
    ? `Active organization: ${active.name} (you are ${ROLE_WORDS[active.role] ?? active.role}).`
    : "No active organization: your access tokens name none.";
}

function orgItem(org) {
  const item = document.createElement("li");
  item.dataset.orgId = org.id;
  item.dataset.role = org.role;
  const active = org.id === activeOrgId;
  if (active) item.classList.add("active");
  item.append(part("span", "org-name", org.name), part("span", "org-role", ` — ${ROLE_WORDS[org.role] ?? org.role}`));
  if (active) item.append(part("span", "org-active", " (active)"));
  item.append(
    " ",
    active
      ? smallButton("Stop using", `Stop using ${org.name} as the active organization`, () => switchOrg(null))
      : smallButton("Make active", `Make ${org.name} the active organization`, () => switchOrg(org)),
    " ",
    smallButton("Members", `Show the members of ${org.name}`, () => showOrg(org)),
  );
  return item;
}

async function createOrg(event) {
  event.preventDefault();
  $("orgs-error").textContent = "";
  $("orgs-message").textContent = "";
  const name = $("org-name").value.trim();
  if (!name) {
    $("orgs-error").textContent = "Give the organization a name.";
    return;
  }
  try {
    const org = await client.json("/orgs", { method: "POST", body: { name } });
    $("org-name").value = "";
    $("orgs-message").textContent = `${org.name} is created; you are its owner.`;
    loadActivity();
    await loadOrgs();
    showOrg(orgs.find((found) => found.id === org.id) ?? { ...org, role: "owner" });
  } catch (error) {
    $("orgs-error").textContent = error.message;
  }
}

// The active organization: the session's next access tokens name it (the answer rotates the session's tokens).
async function switchOrg(org) {
  $("orgs-error").textContent = "";
  $("orgs-message").textContent = "";
  try {
    const answer = await client.switchOrg(org ? org.id : null);
    activeOrgId = "org_id" in (answer ?? {}) ? answer.org_id : org ? org.id : null;
  } catch (error) {
    $("orgs-error").textContent = error.message;
    return;
  }
  $("orgs-message").textContent = org ? `You now act for ${org.name}.` : "You act for no organization now.";
  await loadOrgs();
  loadSessions();
}

async function showOrg(org) {
  const opening = openOrg?.id !== org.id;
  openOrg = org;
  $("org-title").textContent = org.name;
  $("org-about").textContent = `You are ${ROLE_WORDS[org.role] ?? org.role} here. Its id: ${org.id}.`;
  const manager = managesMembers(org.role);
  $("org-invite-form").hidden = !manager;
  $("org-invite-role").querySelector('option[value="owner"]').hidden = org.role !== "owner"; // admins invite no owner
  if (org.role !== "owner" && $("org-invite-role").value === "owner") $("org-invite-role").value = "member";
  $("org-invitations-panel").hidden = !manager;
  if (opening) {
    $("org-message").textContent = "";
    $("org-error").textContent = "";
  }
  $("org").hidden = false;
  await Promise.all([loadMembers(org), manager ? loadInvitations(org) : null]);
}

function closeOrg() {
  openOrg = null;
  $("org").hidden = true;
  $("org-members").replaceChildren();
  $("org-invitations").replaceChildren();
}

function orgPath(org, rest = "") {
  return `/orgs/${encodeURIComponent(org.id)}${rest}`;
}

async function loadMembers(org) {
  let members;
  try {
    members = (await client.json(orgPath(org, "/members"))).members;
  } catch (error) {
    if (openOrg === org) $("org-error").textContent = error.message;
    return;
  }
  if (openOrg !== org) return;
  for (const member of members) if (member.email) memberEmails.set(member.user_id, member.email);
  $("org-members").replaceChildren(...members.map((member) => memberItem(org, member)));
}

function mayRemove(org, member) {
  if (member.user_id === me?.id) return true; // anyone may leave
  return org.role === "owner" || (org.role === "admin" && member.role === "member");
}

function memberItem(org, member) {
  const item = document.createElement("li");
  item.dataset.userId = member.user_id;
  item.dataset.role = member.role;
  const you = member.user_id === me?.id;
  const joined = member.joined_at ? `, since ${new Date(member.joined_at).toLocaleDateString()}` : "";
  item.append(
    part("span", "member-email", member.email ?? member.user_id),
    part("span", "member-role", ` — ${ROLE_WORDS[member.role] ?? member.role}${joined}`),
  );
  if (you) item.append(part("span", "me", " (you)"));
  if (mayRemove(org, member)) {
    const who = member.email ?? member.user_id;
    item.append(
      " ",
      you
        ? smallButton("Leave", `Leave ${org.name}`, () => askToRemove(item, org, member))
        : smallButton("Remove", `Remove ${who} from ${org.name}`, () => askToRemove(item, org, member)),
    );
  }
  return item;
}

// Removing someone (or leaving) asks once more, in place: their rooms of the organization close at once.
function askToRemove(item, org, member) {
  const you = member.user_id === me?.id;
  const who = member.email ?? member.user_id;
  const question = you
    ? `Leave ${org.name}? Its rooms close for you at once.`
    : `Remove ${who} from ${org.name}? Its rooms close for them at once.`;
  const yes = you
    ? smallButton("Yes, leave", `Yes, leave ${org.name}`, () => removeMember(org, member))
    : smallButton("Yes, remove", `Yes, remove ${who} from ${org.name}`, () => removeMember(org, member));
  yes.classList.add("danger");
  item.replaceChildren(
    part("span", "question", question),
    " ",
    yes,
    " ",
    smallButton("Cancel", `Keep ${you ? "your membership" : who}`, () => showOrg(org)),
  );
  yes.focus();
}

async function removeMember(org, member) {
  $("org-error").textContent = "";
  $("org-message").textContent = "";
  const you = member.user_id === me?.id;
  try {
    await client.json(orgPath(org, `/members/${encodeURIComponent(member.user_id)}`), { method: "DELETE" });
  } catch (error) {
    $("org-error").textContent = error.message;
    await showOrg(org);
    return;
  }
  if (you) {
    closeOrg();
    $("orgs-message").textContent = `You left ${org.name}.`;
    loadActivity();
    await loadOrgs();
    return;
  }
  $("org-message").textContent = `${member.email ?? member.user_id} is no longer a member of ${org.name}.`;
  await showOrg(org);
}

async function invite(event) {
  event.preventDefault();
  const org = openOrg;
  if (!org) return;
  $("org-error").textContent = "";
  $("org-message").textContent = "";
  const email = $("org-invite-email").value.trim();
  const role = $("org-invite-role").value;
  if (!email) {
    $("org-error").textContent = "Give the e-mail address to invite.";
    return;
  }
  try {
    await client.json(orgPath(org, "/invitations"), { method: "POST", body: { email, role } });
  } catch (error) {
    $("org-error").textContent = error.message;
    return;
  }
  $("org-invite-email").value = "";
  $("org-message").textContent = `An invitation to join as ${role} is on its way to ${email}. Its link works for 7 days.`;
  await loadInvitations(org);
}

async function loadInvitations(org) {
  let invitations;
  try {
    invitations = (await client.json(orgPath(org, "/invitations"))).invitations;
  } catch (error) {
    if (openOrg === org) $("org-error").textContent = error.message;
    return;
  }
  if (openOrg !== org) return;
  $("org-invitations-empty").hidden = invitations.length > 0;
  $("org-invitations").replaceChildren(
    ...invitations.map((invitation) => {
      const item = document.createElement("li");
      item.dataset.invitationId = invitation.id;
      item.append(
        part("span", "invitation-email", invitation.email),
        part(
          "span",
          "invitation-about",
          ` — ${invitation.role}, until ${new Date(invitation.expires_at).toLocaleDateString()} `,
        ),
        smallButton("Withdraw", `Withdraw the invitation of ${invitation.email}`, () => revokeInvitation(org, invitation)),
      );
      return item;
    }),
  );
}

async function revokeInvitation(org, invitation) {
  $("org-error").textContent = "";
  $("org-message").textContent = "";
  try {
    await client.json(orgPath(org, `/invitations/${encodeURIComponent(invitation.id)}`), { method: "DELETE" });
    $("org-message").textContent = `The invitation of ${invitation.email} no longer works.`;
  } catch (error) {
    $("org-error").textContent = error.message;
  }
  await loadInvitations(org);
}

// An organization's room: the channel `<namespace>:<org id>` of the namespace the service keeps for them.
function joinOrgRoom(event) {
  event.preventDefault();
  const namespace = $("org-room-namespace").value.trim();
  $("org-error").textContent = "";
  if (!openOrg) return;
  if (!/^[a-z0-9_-]{1,32}$/.test(namespace)) {
    $("org-error").textContent = "A namespace is 1-32 of a-z, 0-9, _ and -, e.g. team.";
    return;
  }
  $("room-name").value = `${namespace}:${openOrg.id}`;
  $("room-join-form").requestSubmit();
  $("rooms").scrollIntoView();
}

// The invitation a mailed link brought to this tab: accepted by the signed-in user whose verified address
// it was sent to.
function pendingInvitation() {
  return sessionStorage.getItem(INVITATION_KEY);
}

function askToSignInForInvitation() {
  $("status").textContent = "Log in to accept your invitation to an organization.";
  showNotice(
    "You are invited to join an organization. Log in with the address the invitation was mailed to (or create " +
      "an account with it and verify it), and you can accept it here.",
    "info",
  );
}

function showInvitation() {
  const token = pendingInvitation();
  $("invitation").hidden = !token;
  if (!token) return;
  $("invitation-error").textContent = "";
  $("invitation-text").textContent =
    `Accept it to join the organization as ${me.email}, with the role the invitation gives. It works only ` +
    "for the address it was mailed to, once that address is verified.";
  $("invitation-accept-button").focus();
}

async function acceptInvitation() {
  const token = pendingInvitation();
  if (!token) return showInvitation();
  $("invitation-error").textContent = "";
  let org;
  try {
    org = await client.json("/orgs/invitations/accept", { method: "POST", body: { token } });
  } catch (error) {
    if (error.code === "invalid_token") {
      dismissInvitation();
      showNotice(
        `This invitation does not work any more: ${error.message} It was used, withdrawn, or is older than ` +
          "7 days. Ask for a new one.",
        "failure",
      );
    } else {
      $("invitation-error").textContent = error.message;
    }
    return;
  }
  dismissInvitation();
  showNotice(`You joined ${org.name} as ${ROLE_WORDS[org.role] ?? org.role}.`, "success");
  loadActivity();
  await loadOrgs();
  const joined = orgs.find((found) => found.id === org.id);
  if (joined) await showOrg(joined);
}

function dismissInvitation() {
  sessionStorage.removeItem(INVITATION_KEY);
  $("invitation").hidden = true;
}

async function logOut(everywhere) {
  await client.logout({ everywhere }).catch(() => {});
  showSignedOut(everywhere ? "You logged out everywhere." : "You logged out.");
}

// Outside a secure context (plain HTTP at an address other than localhost) the browser refuses the
// service's Secure session cookies, so a login would seem to succeed and then fail: say so instead.
function explainInsecureContext() {
  const local = `${location.protocol}//localhost${location.port ? `:${location.port}` : ""}${location.pathname}`;
  $("status").textContent =
    `This page is served over plain HTTP at ${location.hostname}, so the browser refuses the service's ` +
    `Secure session cookies and nobody can log in here. Serve it over HTTPS, or open it at ${local}.`;
  $("status").classList.add("error");
}

// Browsers tie a passkey to a domain name, never to an IP address: at one, passkeys are not offered, and the
// page says why and where they work (at localhost, for an address of this machine) instead of leaving them out.
function explainPasskeysAtAnAddress() {
  const host = location.hostname;
  const ipAddress = /^\d+(\.\d+){3}$/.test(host) || host.startsWith("[");
  if (!ipAddress || typeof globalThis.PublicKeyCredential !== "function") return;
  const why =
    "Passkeys are not offered here: browsers tie a passkey to a domain name, never to an IP address " +
    `such as ${host}.`;
  const loopback = host.startsWith("127.") || host === "[::1]";
  const there = `${location.protocol}//localhost${location.port ? `:${location.port}` : ""}/`;
  for (const id of ["passkey-login-note", "passkey-account-note"]) {
    const note = $(id);
    if (loopback) {
      const link = document.createElement("a");
      link.href = there;
      link.textContent = there;
      note.replaceChildren(`${why} They work at `, link, ", this page at the name localhost.");
    } else {
      note.textContent = `${why} They work when this page is opened at the service's domain name.`;
    }
    note.hidden = false;
  }
  $("passkeys-section").hidden = false; // with the note only: nothing there works at this address
  $("passkeys-empty").hidden = true;
  $("passkey-add-form").hidden = true;
}

async function start() {
  if (!window.isSecureContext) return explainInsecureContext();
  $("login-form").addEventListener("submit", logIn);
  $("passkey-login-button").hidden = !passkeysSupported();
  $("passkey-login-button").addEventListener("click", logInWithPasskey);
  $("passkeys-section").hidden = !passkeysSupported();
  explainPasskeysAtAnAddress();
  $("passkey-add-form").addEventListener("submit", addPasskey);
  $("reauth-passkey-button").addEventListener("click", reauthenticateWithPasskey);
  $("register-button").addEventListener("click", register);
  $("forgot-button").addEventListener("click", () => {
    $("forgot-email").value = $("login-email").value;
    $("forgot-message").textContent = "";
    showForm("forgot-form");
  });
  $("forgot-cancel-button").addEventListener("click", () => showForm("login-form"));
  $("forgot-form").addEventListener("submit", askForReset);
  $("reset-form").addEventListener("submit", resetPassword);
  $("mfa-form").addEventListener("submit", finishLogin);
  $("mfa-recovery-button").addEventListener("click", () => setRecoveryMode(!useRecoveryCode));
  $("mfa-cancel-button").addEventListener("click", () => showSignedOut("You are logged out."));
  $("resend-button").addEventListener("click", resendVerification);
  $("mfa-setup-button").addEventListener("click", startMfaSetup);
  $("mfa-setup-form").addEventListener("submit", confirmMfaSetup);
  $("reauth-form").addEventListener("submit", reauthenticate);
  $("mfa-disable-form").addEventListener("submit", disableMfa);
  $("publish-form").addEventListener("submit", publish);
  $("room-join-form").addEventListener("submit", joinRoom);
  $("room-leave-button").addEventListener("click", leaveRoom);
  $("room-message-form").addEventListener("submit", sendMessage);
  $("org-create-form").addEventListener("submit", createOrg);
  $("org-invite-form").addEventListener("submit", invite);
  $("org-room-form").addEventListener("submit", joinOrgRoom);
  $("org-close-button").addEventListener("click", closeOrg);
  $("invitation-accept-button").addEventListener("click", acceptInvitation);
  $("invitation-dismiss-button").addEventListener("click", dismissInvitation);
  $("logout-button").addEventListener("click", () => logOut(false));
  $("logout-all-button").addEventListener("click", () => logOut(true));
  $("activity-more-button").addEventListener("click", () => loadActivity(true));
  $("activity-refresh-button").addEventListener("click", () => loadActivity());
  $("transports").addEventListener("change", () => me && feed.start(selectedTransport()));
  addEventListener("online", () => me && feed.state === "offline" && feed.start(selectedTransport()));

  returnTo = takeReturnTo();
  if (authorizing()) keepRequestThroughProviders();
  const link = await followLink();
  if (link.reset) {
    if ((await resetLinkWorks(resetToken)) === false) return showUnusableResetLink();
    showSignedOut("Choose a new password for your account.");
    return showForm("reset-form");
  }
  if (link.mfaToken) {
    showSignedOut("");
    return askForSecondFactor(link.mfaToken);
  }
  let user = null;
  try {
    user = await client.me(); // GET /auth/status first: a visitor without a session sees no 401
    if (user && !reauth) await showSignedIn(user);
    else showSignedOut("You are logged out.");
  } catch (error) {
    showSignedOut(`The service cannot check your session: ${error.message}`);
  }
  if (link.verification) showVerification(link.verification, user);
  if (!me && !returnTo && pendingInvitation()) askToSignInForInvitation();
}

start();
