// The page: log in, devices, live events. All server calls go through the reference client.
import { Client, EventFeed } from "./client.js";

const $ = (id) => document.getElementById(id);
const SESSIONS_REFRESH_MS = 3000;

const client = new Client({ onLoggedOut: () => showSignedOut("You are logged out.") });
const feed = new EventFeed(client, { onEvent: logEvent, onState: (text) => ($("connection").textContent = text) });
let me = null;
let sessionsTimer = null;

// For debugging from the console (and for the browser tests): the client objects, never a token.
window.authRt = { client, feed };

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

function logEvent(event) {
  const item = document.createElement("li");
  item.dataset.eventId = event.id;
  item.dataset.event = event.event;
  item.textContent = `${event.event}: ${JSON.stringify(event.data)}`;
  $("event-log").prepend(item);
}

function deviceName() {
  const ua = navigator.userAgent;
  const browser = /Edg\//.test(ua) ? "Edge" : /Firefox\//.test(ua) ? "Firefox" : /Chrome\//.test(ua) ? "Chrome"
    : /Safari\//.test(ua) ? "Safari" : "A browser";
  const system = /Android/.test(ua) ? "Android" : /iPhone|iPad/.test(ua) ? "iOS" : /Mac OS X/.test(ua) ? "macOS"
    : /Windows/.test(ua) ? "Windows" : /Linux/.test(ua) ? "Linux" : "another system";
  return `${browser} on ${system}`;
}

async function credentials() {
  const form = $("login-form");
  return { email: form.email.value, password: form.password.value };
}

async function logIn(event) {
  event?.preventDefault();
  $("login-error").textContent = "";
  const body = { ...(await credentials()), device: deviceName() };
  const response = await client.request("/auth/login", { method: "POST", body });
  if (!response.ok) {
    $("login-error").textContent = (await response.json()).error.message;
    return;
  }
  $("login-form").password.value = "";
  await showSignedIn((await response.json()).user);
}

async function register() {
  $("login-error").textContent = "";
  const response = await client.request("/auth/register", { method: "POST", body: await credentials() });
  if (!response.ok) {
    $("login-error").textContent = (await response.json()).error.message;
    return;
  }
  await logIn();
}

async function publish(event) {
  event.preventDefault();
  const form = $("publish-form");
  feed.listen(form.event.value);
  const body = { channel: `user:${me.id}`, event: form.event.value, data: form.data.value };
  const response = await client.request("/events", { method: "POST", body });
  $("publish-error").textContent = response.ok ? "" : (await response.json()).error.message;
  if (response.ok) form.data.value = "";
}

async function start() {
  $("login-form").addEventListener("submit", logIn);
  $("register-button").addEventListener("click", register);
  $("publish-form").addEventListener("submit", publish);
  $("logout-button").addEventListener("click", async () => {
    await client.request("/auth/logout", { method: "POST" });
    showSignedOut("You logged out.");
  });
  $("logout-all-button").addEventListener("click", async () => {
    await client.request("/auth/logout-all", { method: "POST" });
    showSignedOut("You logged out everywhere.");
  });
  $("transports").addEventListener("change", () => me && feed.start(selectedTransport()));

  client.signedIn = true; // so a failed first check reports "logged out"
  const response = await client.request("/auth/me");
  if (response.ok) await showSignedIn((await response.json()).user);
  else showSignedOut("You are logged out.");
}

start();
