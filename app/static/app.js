// The test page: log in, devices, live events. All server calls go through the reference client.
import { Client, EventFeed } from "./client.js";

const $ = (id) => document.getElementById(id);
const SESSIONS_REFRESH_MS = 3000;

const TRANSPORT_NAMES = {
  sse: "server-sent events",
  websocket: "WebSocket",
  "long-poll": "long polling",
  poll: "polling",
};
const STATE_NAMES = { connecting: "Connecting", live: "Live", reconnecting: "Reconnecting", offline: "Offline" };

const client = new Client({ onLoggedOut: () => showSignedOut("You are logged out.") });
const feed = new EventFeed(client, { onEvent: logEvent, onState: showConnection });
let me = null;
let sessionsTimer = null;

// For debugging from the console (and for the browser tests): the client objects, never a token.
window.authRt = { client, feed };

function showConnection(state, transport) {
  const line = $("connection");
  line.dataset.state = state;
  const via = transport && state !== "offline" ? ` (${TRANSPORT_NAMES[transport]})` : "";
  line.textContent = `${STATE_NAMES[state]}${via}`;
}

function showSignedOut(message) {
  me = null;
  feed.stop();
  clearInterval(sessionsTimer);
  $("signed-in").hidden = true;
  $("signed-out").hidden = false;
  $("status").textContent = message;
}

async function showSignedIn(user) {
  me = user;
  client.loggedIn();
  $("signed-out").hidden = true;
  $("signed-in").hidden = false;
  $("status").textContent = `Logged in as ${user.email}`;
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
  else loadSessions();
}

function part(tag, className, text) {
  const element = document.createElement(tag);
  element.className = className;
  element.textContent = text;
  return element;
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
  try {
    const user = await client.login({ ...credentials(), device: deviceName() });
    $("login-form").password.value = "";
    await showSignedIn(user);
  } catch (error) {
    $("login-error").textContent = error.message;
  }
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

async function start() {
  if (!window.isSecureContext) return explainInsecureContext();
  $("login-form").addEventListener("submit", logIn);
  $("register-button").addEventListener("click", register);
  $("publish-form").addEventListener("submit", publish);
  $("logout-button").addEventListener("click", () => logOut(false));
  $("logout-all-button").addEventListener("click", () => logOut(true));
  $("transports").addEventListener("change", () => me && feed.start(selectedTransport()));
  addEventListener("online", () => me && feed.state === "offline" && feed.start(selectedTransport()));

  try {
    const user = await client.me();
    if (user) await showSignedIn(user);
    else showSignedOut("You are logged out.");
  } catch (error) {
    showSignedOut(`The service cannot check your session: ${error.message}`);
  }
}

start();
