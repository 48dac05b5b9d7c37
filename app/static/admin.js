// The admin console: users, organizations, API keys, webhooks sent, channels, trusted issuers, applications
// (OpenID clients) and the audit log. Every call goes through the reference client (Client for the session, Admin for the
// administrators' endpoints, the client's JSON request for the issuers and the applications); the page keeps
// nothing but what it shows. The server sends this
// page to administrators only.
import { Admin, Client } from "./client.js";

const $ = (id) => document.getElementById(id);
const SECTIONS = ["users", "orgs", "api-keys", "webhooks", "channels", "issuers", "oauth-clients", "audit"];
const USERS_PAGE = 50;
const ORGS_PAGE = 50;
const AUDIT_PAGE = 50;
const MESSAGES_PAGE = 20;
const REPLAY_DEFAULT_MS = 60 * 60 * 1000; // a replay's default start: an hour ago

// A session that a refresh cannot cure is gone: the page at / says so and offers the login.
const client = new Client({ onLoggedOut: () => location.assign("/") });
const admin = new Admin(client);
const me = document.body.dataset.me;

// For debugging from the console (and for the browser tests): the client objects, never a token.
window.authRt = { client, admin };

// ---- Small helpers: elements, times, the confirmation step ----

function el(tag, { className, text, ...attributes } = {}, ...children) {
  const element = document.createElement(tag);
  if (className) element.className = className;
  if (text !== undefined) element.textContent = text;
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, value);
  element.append(...children);
  return element;
}

function cell(...children) {
  return el("td", {}, ...children);
}

function button(text, label, onClick, className) {
  const element = el("button", { type: "button", text, "aria-label": label, ...(className ? { className } : {}) });
  element.addEventListener("click", onClick);
  return element;
}

function time(value, never = "never") {
  if (!value) return document.createTextNode(never);
  const element = el("time", { text: new Date(value).toLocaleString() });
  element.dateTime = value;
  return element;
}

function list(values) {
  return values?.length ? values.join(", ") : "none";
}

function split(text) {
  return text
    .split(",")
    .map((part) => part.trim())
    .filter(Boolean);
}

// Every destructive action asks here first: a modal dialog in the page, answered by its two buttons
// (Escape cancels). Resolves with whether the administrator confirmed.
function confirmAction(text, yes) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-yes").textContent = yes;
  return new Promise((resolve) => {
    const answer = (confirmed) => {
      $("confirm-yes").removeEventListener("click", onYes);
      $("confirm-no").removeEventListener("click", onNo);
      dialog.removeEventListener("cancel", onCancel);
      dialog.close();
      resolve(confirmed);
    };
    const onYes = () => answer(true);
    const onNo = () => answer(false);
    const onCancel = (event) => {
      event.preventDefault();
      answer(false);
    };
    $("confirm-yes").addEventListener("click", onYes);
    $("confirm-no").addEventListener("click", onNo);
    dialog.addEventListener("cancel", onCancel);
    dialog.showModal();
    $("confirm-no").focus(); // the safe answer is the one a stray Enter gives
  });
}

// What a failure says to the administrator: the service's own message, or in words when the service was not
// reached at all (fetch rejects with a TypeError whose text differs by browser: "Failed to fetch", ...).
function failureText(error) {
  if (error instanceof TypeError && /fetch|network|load failed/i.test(error.message)) {
    return "The service could not be reached. Check the connection and try again.";
  }
  return error.message;
}

// Runs an action, showing its failure (the service's message) in `errorLine`; resolves with its result,
// or undefined when it failed.
async function attempt(errorLine, action) {
  $(errorLine).textContent = "";
  try {
    return await action();
  } catch (error) {
    $(errorLine).textContent = failureText(error);
    return undefined;
  }
}

// The same for an action without a result: resolves with whether it succeeded.
async function perform(errorLine, action) {
  return (
    (await attempt(errorLine, async () => {
      await action();
      return true;
    })) === true
  );
}

// ---- Users, named by id in audit entries and grants: shown by their e-mail once it is known ----

const emails = new Map(); // user id -> Promise of what names them (null: no such user any more)

// A user as the console names them: their e-mail; a user from a trusted issuer without one, by the
// issuer's name for them.
function nameOf(user) {
  if (user.email) return user.email;
  return user.external ? `${user.external.sub} (${user.external.issuer})` : user.id;
}

function emailOf(id) {
  if (!emails.has(id)) {
    emails.set(
      id,
      admin.user(id).then(
        (detail) => nameOf(detail.user),
        () => null,
      ),
    );
  }
  return emails.get(id);
}

function userLink(id) {
  const link = el("a", { href: `#user/${id}`, className: "user-ref", text: id, title: id });
  link.dataset.userId = id;
  emailOf(id).then((email) => {
    link.textContent = link.title = email ?? `${id} (deleted)`;
  });
  return link;
}

// A link to a user named by their address: kept whole on one line (style.css), the whole of it in its title.
function emailLink(href, text) {
  return el("a", { href, className: "email", text, title: text });
}

// ---- Audit entries: a table with paging, for the audit log and a user's trail ----

const ACTOR_KINDS = { cli: "the command line", system: "the service" };

function actorView(actor) {
  if (actor.kind === "user" && actor.id) return userLink(actor.id);
  if (actor.kind === "api_key") return el("span", { className: "api-key-ref", text: `API key ${actor.id}` });
  return document.createTextNode(ACTOR_KINDS[actor.kind] ?? actor.kind);
}

// An entry's details as lines of "key: value" in words: nested objects by their path ("info name: Ada"),
// lists joined with commas, yes/no for true/false, "none" for null or an empty list.
function detailLines(details, path = []) {
  const lines = [];
  for (const [key, value] of Object.entries(details ?? {})) {
    const name = [...path, key.replaceAll("_", " ")];
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      lines.push(...detailLines(value, name));
    } else {
      lines.push([name.join(" "), detailValue(value)]);
    }
  }
  return lines;
}

function detailValue(value) {
  if (value === null || value === undefined) return "none";
  if (value === true) return "yes";
  if (value === false) return "no";
  if (Array.isArray(value)) return value.length ? value.map(detailValue).join(", ") : "none";
  if (typeof value === "object") {
    return detailLines(value)
      .map(([key, text]) => `${key}: ${text}`)
      .join("; ");
  }
  return String(value);
}

function detailsView(details) {
  return el(
    "ul",
    { className: "details" },
    ...detailLines(details).map(([key, text]) =>
      el("li", {}, el("span", { className: "detail-key", text: `${key}: ` }), el("span", { text })),
    ),
  );
}

function entryRow(entry) {
  const row = el(
    "tr",
    { className: "entry" },
    cell(time(entry.at)),
    cell(el("code", { className: "type", text: entry.type })),
    cell(el("span", { className: "actor" }, actorView(entry.actor))),
    cell(entry.subject ? userLink(entry.subject) : ""),
    el("td", { className: "ip", text: entry.ip ?? "" }),
    cell(detailsView(entry.details)),
  );
  row.dataset.entryId = entry.id;
  row.dataset.type = entry.type;
  row.dataset.actorKind = entry.actor.kind;
  row.dataset.actorId = entry.actor.id ?? "";
  row.dataset.subject = entry.subject ?? "";
  return row;
}

class AuditTable {
  /**
   * @param {HTMLElement} container where the table goes (its `data-empty` says what an empty one means)
   * @param {(before: string | undefined) => Promise<{entries: object[], next: string | null}>} fetchPage
   * @param {string} errorLine the id of the element that shows a failure
   */
  constructor(container, fetchPage, errorLine) {
    this.fetchPage = fetchPage;
    this.errorLine = errorLine;
    this.next = null;
    this.body = el("tbody");
    const head = ["When", "What", "By", "About", "From", "Details"].map((name) => el("th", { text: name }));
    this.table = el("table", { className: "audit-table" }, el("thead", {}, el("tr", {}, ...head)), this.body);
    this.empty = el("p", { className: "empty", text: container.dataset.empty });
    this.more = button("Older entries", "Show older entries", () => this.load());
    container.replaceChildren(this.table, this.empty, this.more);
    this.table.hidden = this.empty.hidden = this.more.hidden = true;
  }

  /** The first page again (after a change, or new filters). */
  reload() {
    this.next = null;
    this.body.replaceChildren();
    return this.load();
  }

  async load() {
    const page = await attempt(this.errorLine, () => this.fetchPage(this.next ?? undefined));
    if (!page) return;
    this.body.append(...page.entries.map(entryRow));
    this.next = page.next;
    const rows = this.body.children.length;
    this.table.hidden = rows === 0;
    this.empty.hidden = rows > 0;
    this.more.hidden = !page.next;
  }
}

// ---- Sections, chosen by the address's fragment: #users, #orgs, #api-keys, ..., #user/<id>, #org/<id> ----

const loaders = {
  users: () => {},
  orgs: () => loadOrgs(false),
  "api-keys": loadKeys,
  webhooks: loadEndpoints,
  channels: loadNamespaces,
  issuers: loadIssuers,
  "oauth-clients": loadOAuthClients,
  audit: () => auditLog.reload(),
};

function route() {
  const [first, id] = location.hash.slice(1).split("/");
  const section = first === "user" ? "users" : first === "org" ? "orgs" : SECTIONS.includes(first) ? first : "users";
  for (const name of SECTIONS) $(name).hidden = name !== section;
  for (const link of document.querySelectorAll("#sections a")) {
    if (link.dataset.section === section) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (first === "user" && id) openUser(decodeURIComponent(id));
  else if (first === "org" && id) {
    if (!orgsLoaded) loadOrgs(false);
    openOrg(decodeURIComponent(id));
  } else loaders[section]();
}

// ---- Users ----

const SEARCH_DELAY_MS = 250; // typing pauses this long before the search is sent
let usersOffset = 0;
let searchTimer = null;
let searchSeq = 0; // answers to older searches than the newest are dropped
let shownUser = null; // the user whose detail is open
let userTrail = null;

function userRow(user) {
  const row = el(
    "tr",
    { className: "user" },
    cell(user.email ? emailLink(`#user/${user.id}`, nameOf(user)) : el("a", { href: `#user/${user.id}`, text: nameOf(user) })),
    cell(user.role),
    cell(user.email_verified ? "yes" : "no"),
    cell(user.mfa_enabled ? "on" : "off"),
    cell(time(user.created_at, "")),
  );
  row.dataset.userId = user.id;
  return row;
}

// The list as the administrator types: the users whose address starts with the text (the newest users once
// it is empty). Resolves with the users shown, or undefined when this search was overtaken or failed.
async function showSearch() {
  clearTimeout(searchTimer);
  const text = $("user-find-email").value.trim();
  const seq = ++searchSeq;
  if (!text) {
    await newestUsers(false);
    return undefined;
  }
  $("users-error").textContent = "";
  let found;
  try {
    found = await admin.users({ q: text }); // the first 50 whose address starts with it, any case
  } catch (error) {
    if (seq === searchSeq) $("users-error").textContent = failureText(error);
    return undefined;
  }
  if (seq !== searchSeq) return undefined; // a newer search is under way: its answer is the one to show
  showUserList(found, `Users whose address starts with "${text}"`, false);
  $("user-list-empty").textContent = `No user's address starts with "${text}".`;
  $("user-list-empty").hidden = found.length > 0;
  return found;
}

function searchAsTyped() {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(showSearch, SEARCH_DELAY_MS);
}

// Enter or Find: the search at once; the one user it finds (or the one with exactly this address) opens.
async function findUser(event) {
  event.preventDefault();
  const text = $("user-find-email").value.trim().toLowerCase();
  const found = await showSearch();
  if (!found?.length) return;
  const exact = found.find((user) => user.email === text);
  const only = exact ?? (found.length === 1 ? found[0] : null);
  if (!only) return;
  const target = `#user/${only.id}`;
  if (location.hash === target) await openUser(only.id); // shown already: show it afresh
  else location.hash = target;
}

async function newestUsers(more = false) {
  if (!more) {
    clearTimeout(searchTimer); // a search still to be sent, or under way, would replace this list
    searchSeq++;
  }
  usersOffset = more ? usersOffset + USERS_PAGE : 0;
  const found = await attempt("users-error", () => admin.users({ limit: USERS_PAGE, offset: usersOffset }));
  if (!found) return;
  showUserList(found, "Newest users", more);
  $("user-more-button").hidden = found.length < USERS_PAGE;
}

function showUserList(users, caption, append) {
  $("user-list-caption").textContent = caption;
  const body = $("user-list").tBodies[0];
  if (append) body.append(...users.map(userRow));
  else body.replaceChildren(...users.map(userRow));
  $("user-list").hidden = body.children.length === 0;
  $("user-list-empty").hidden = true;
  $("user-more-button").hidden = true;
}

async function openUser(id) {
  $("user-message").textContent = "";
  const detail = await attempt("users-error", () => admin.user(id));
  if (!detail) {
    $("user-detail").hidden = true;
    shownUser = null;
    return;
  }
  const { user, sessions, passkeys } = detail;
  shownUser = user;
  emails.set(user.id, Promise.resolve(nameOf(user)));
  $("user-title").textContent = user.id === me ? `${nameOf(user)} (you)` : nameOf(user);
  $("user-id").textContent = user.id;
  $("user-role").textContent = user.role;
  $("user-created").replaceChildren(time(user.created_at, "unknown"));
  $("user-verified").textContent = user.email_verified ? "verified" : "not verified";
  $("user-mfa").textContent = user.mfa_enabled ? "on (TOTP)" : "off";
  $("user-origin").textContent = user.external
    ? `through the trusted issuer ${user.external.issuer}, as ${user.external.sub}`
    : "here (password, passkey or OAuth)";
  $("user-role-select").value = user.role;
  $("user-reset-mfa-button").disabled = false;
  $("user-sessions").replaceChildren(
    ...sessions.map((session) => {
      const item = el(
        "li",
        {},
        el("span", { className: "device", text: session.device ?? "unknown device" }),
        ` from ${session.ip ?? "an unknown address"}, since `,
        time(session.created_at, "?"),
        ", last used ",
        time(session.last_used_at, "?"),
      );
      item.dataset.sessionId = session.id;
      return item;
    }),
  );
  $("user-sessions-empty").hidden = sessions.length > 0;
  $("user-passkeys").replaceChildren(
    ...passkeys.map((passkey) => {
      const item = el(
        "li",
        {},
        el("span", { className: "passkey-name", text: passkey.name }),
        ", added ",
        time(passkey.created_at),
        ", last used ",
        time(passkey.last_used_at),
      );
      item.dataset.passkeyId = passkey.id;
      return item;
    }),
  );
  $("user-passkeys-empty").hidden = passkeys.length > 0;
  $("user-detail").hidden = false;
  userTrail = new AuditTable(
    $("user-audit"),
    (before) => admin.audit({ subject: user.id, before, limit: AUDIT_PAGE }),
    "user-error",
  );
  await userTrail.reload();
}

// One of the user detail's actions: confirmed, done, said, and the detail shown again (its trail too).
async function userAction(question, yes, action, done) {
  const user = shownUser;
  if (!user || !(await confirmAction(question(user), yes))) return;
  $("user-message").textContent = "";
  if (!(await perform("user-error", () => action(user)))) return;
  if (shownUser?.id === user.id) await openUser(user.id);
  $("user-message").textContent = done(user);
}

function changeRole() {
  const role = $("user-role-select").value;
  return userAction(
    (user) => `Make ${nameOf(user)} ${role === "admin" ? "an administrator" : "a user"}? It applies on their next request.`,
    "Change the role",
    (user) => admin.setRole(user.id, role),
    (user) => `${nameOf(user)} is now ${role === "admin" ? "an administrator" : "a user"}.`,
  );
}

function endSessions() {
  return userAction(
    (user) => `Log ${nameOf(user)} out on every device? Their live connections close at once.`,
    "End every session",
    (user) => admin.endSessions(user.id),
    (user) => `${nameOf(user)} is logged out everywhere.`,
  );
}

function resetMfa() {
  return userAction(
    (user) =>
      `Turn off two-factor authentication for ${nameOf(user)}? Their authenticator secret and recovery codes ` +
      "are deleted, every session ends, and they are mailed.",
    "Reset MFA",
    (user) => admin.resetMfa(user.id),
    (user) => `Two-factor authentication is off for ${nameOf(user)}; they can set it up again.`,
  );
}

async function deleteUser() {
  const user = shownUser;
  if (!user) return;
  const question = `Delete ${nameOf(user)} and every record of theirs? Their sessions end at once. This cannot be undone.`;
  if (!(await confirmAction(question, "Delete the user"))) return;
  if (!(await perform("user-error", () => admin.deleteUser(user.id)))) return;
  emails.set(user.id, Promise.resolve(null));
  shownUser = null;
  $("user-detail").hidden = true;
  for (const row of document.querySelectorAll(`#user-list tr[data-user-id="${user.id}"]`)) row.remove();
  $("users-error").textContent = "";
  $("status").textContent = `${nameOf(user)} (${user.id}) is deleted. The audit log keeps what happened to the account.`;
  history.replaceState(null, "", "#users");
}

// ---- Organizations: GET /admin/orgs a page at a time (newest first), one with its members ----

const orgsApi = {
  page: (before) => client.json(`/admin/orgs?${new URLSearchParams({ limit: ORGS_PAGE, ...(before ? { before } : {}) })}`),
  one: (id) => client.json(`/admin/orgs/${encodeURIComponent(id)}`),
};
let orgsNext = null;
let orgsLoaded = false;

async function loadOrgs(more) {
  const page = await attempt("orgs-error", () => orgsApi.page(more ? orgsNext : undefined));
  if (!page) return;
  orgsLoaded = true;
  const body = $("org-list").tBodies[0];
  const rows = page.orgs.map((org) => {
    const row = el(
      "tr",
      { className: "org" },
      cell(el("a", { href: `#org/${org.id}`, text: org.name })),
      cell(el("code", { text: org.id })),
      cell(time(org.created_at, "")),
    );
    row.dataset.orgId = org.id;
    return row;
  });
  if (more) body.append(...rows);
  else body.replaceChildren(...rows);
  orgsNext = page.next;
  $("org-list").hidden = body.children.length === 0;
  $("orgs-empty").hidden = body.children.length > 0;
  $("org-more-button").hidden = !page.next;
}

async function openOrg(id) {
  const org = await attempt("orgs-error", () => orgsApi.one(id));
  if (!org) {
    $("org-detail").hidden = true;
    return;
  }
  $("org-title").textContent = org.name;
  $("org-id").textContent = org.id;
  $("org-created").replaceChildren(time(org.created_at, "unknown"));
  const members = org.members ?? [];
  $("org-count").textContent = String(members.length);
  $("org-member-list").tBodies[0].replaceChildren(
    ...members.map((member) => {
      emails.set(member.user_id, Promise.resolve(member.email ?? member.user_id));
      const row = el(
        "tr",
        { className: "org-member" },
        cell(
          member.email
            ? emailLink(`#user/${member.user_id}`, member.email)
            : el("a", { href: `#user/${member.user_id}`, text: member.user_id }),
        ),
        el("td", { className: "role", text: member.role }),
        cell(time(member.joined_at, "")),
      );
      row.dataset.userId = member.user_id;
      row.dataset.role = member.role;
      return row;
    }),
  );
  $("org-member-list").hidden = members.length === 0;
  $("org-members-empty").hidden = members.length > 0;
  $("org-detail").hidden = false;
}

// ---- API keys ----

async function loadKeys() {
  const keys = await attempt("key-error", () => admin.apiKeys());
  if (!keys) return;
  $("key-list").tBodies[0].replaceChildren(
    ...keys.map((key) => {
      const row = el(
        "tr",
        { className: "api-key" },
        cell(key.name),
        cell(el("code", { text: key.id })),
        cell(list(key.scopes)),
        cell(list(key.channels)),
        cell(time(key.created_at)),
        cell(time(key.last_used_at)),
        cell(button("Delete", `Delete the API key ${key.name}`, () => deleteKey(key), "danger")),
      );
      row.dataset.keyId = key.id;
      return row;
    }),
  );
  $("key-list").hidden = keys.length === 0;
  $("key-list-empty").hidden = keys.length > 0;
}

async function createKey(event) {
  event.preventDefault();
  const form = $("key-create-form");
  const scopes = [...form.querySelectorAll('input[name="scope"]:checked')].map((box) => box.value);
  const asked = { name: form.name.value.trim(), scopes, channels: split(form.channels.value) };
  const created = await attempt("key-error", () => admin.createApiKey(asked));
  if (!created) return;
  form.reset();
  $("key-created-name").textContent = `${created.name} (${created.id})`;
  $("key-secret").textContent = created.key;
  $("key-created").hidden = false;
  await loadKeys();
}

async function deleteKey(key) {
  const question = `Delete the API key ${key.name}? Every backend using it is refused from the next request.`;
  if (!(await confirmAction(question, "Delete the key"))) return;
  await perform("key-error", () => admin.deleteApiKey(key.id));
  await loadKeys();
}

// ---- Webhooks sent: endpoints and their messages ----

async function loadEndpoints() {
  const endpoints = await attempt("endpoint-error", () => admin.webhookEndpoints());
  if (!endpoints) return;
  $("endpoints").replaceChildren(...endpoints.map(endpointView));
  $("endpoints-empty").hidden = endpoints.length > 0;
}

function endpointView(endpoint) {
  const errorId = `endpoint-error-${endpoint.id}`;
  const facts = el(
    "dl",
    { className: "facts" },
    el("dt", { text: "Id" }),
    el("dd", {}, el("code", { text: endpoint.id })),
    el("dt", { text: "State" }),
    el("dd", { className: "state", text: endpoint.disabled ? "disabled" : "enabled" }),
    el("dt", { text: "Channels" }),
    el("dd", { text: list(endpoint.channels) }),
    el("dt", { text: "Events" }),
    el("dd", { text: endpoint.events ? endpoint.events.join(", ") : "all" }),
    el("dt", { text: "Description" }),
    el("dd", { text: endpoint.description ?? "" }),
    el("dt", { text: "Created" }),
    el("dd", {}, time(endpoint.created_at)),
  );
  const toggle = endpoint.disabled ? "Enable" : "Disable";
  const actions = el(
    "div",
    { className: "actions" },
    button(toggle, `${toggle} the endpoint ${endpoint.url}`, () => setDisabled(endpoint, !endpoint.disabled)),
    button("Rotate the secret", `Rotate the secret of ${endpoint.url}`, () => rotateSecret(endpoint)),
    button("Delete", `Delete the endpoint ${endpoint.url}`, () => deleteEndpoint(endpoint), "danger"),
  );
  const error = el("p", { className: "error", id: errorId, role: "alert" });

  const status = el(
    "select",
    { "aria-label": `Which messages of ${endpoint.url}` },
    ...["all", "pending", "delivered", "failed"].map((value) => el("option", { value, text: value })),
  );
  const messages = el("tbody");
  const empty = el("p", { className: "empty", text: "No messages." });
  const table = el(
    "table",
    { className: "messages" },
    el("caption", { text: "Latest messages" }),
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        ...["Message", "Event", "Status", "Attempts", "Last attempt", "Next attempt", ""].map((name) =>
          el("th", { text: name }),
        ),
      ),
    ),
    messages,
  );
  const showMessages = async () => {
    const chosen = status.value === "all" ? undefined : status.value;
    const found = await attempt(errorId, () => admin.webhookMessages(endpoint.id, { status: chosen, limit: MESSAGES_PAGE }));
    if (!found) return;
    messages.replaceChildren(...found.map((message) => messageRow(endpoint, message, errorId, showMessages)));
    table.hidden = found.length === 0;
    empty.hidden = found.length > 0;
  };
  status.addEventListener("change", showMessages);

  const note = el("p", { className: "note", role: "status" });
  const since = el("input", { type: "text" });
  since.value = new Date(Date.now() - REPLAY_DEFAULT_MS).toISOString().replace(/\.\d+Z$/, "Z");
  const replay = el("form", { className: "replay inline-form" });
  replay.noValidate = true;
  replay.append(
    el("label", { text: "Send again every event since (RFC 3339)", className: "inline-label" }),
    since,
    el("button", { type: "submit", text: "Replay", "aria-label": `Replay events to ${endpoint.url}` }),
  );
  replay.querySelector("label").htmlFor = since.id = `replay-since-${endpoint.id}`;
  replay.addEventListener("submit", async (event) => {
    event.preventDefault();
    const question = `Send ${endpoint.url} every matching event since ${since.value} again?`;
    if (!(await confirmAction(question, "Replay"))) return;
    const queued = await attempt(errorId, () => admin.replayWebhooks(endpoint.id, { since: since.value.trim() }));
    if (queued === undefined) return;
    error.textContent = "";
    note.textContent = `${queued} ${queued === 1 ? "message" : "messages"} queued.`;
    await showMessages();
  });

  const article = el(
    "article",
    { className: "endpoint", "aria-label": endpoint.url },
    el("h3", { text: endpoint.url }),
    facts,
    actions,
    error,
    el("div", { className: "inline-form" }, el("span", { text: "Messages: " }), status, button("Refresh", `Refresh the messages of ${endpoint.url}`, showMessages)),
    table,
    empty,
    replay,
    note,
  );
  article.dataset.endpointId = endpoint.id;
  showMessages();
  return article;
}

function messageRow(endpoint, message, errorId, refresh) {
  const last = message.attempts.at(-1);
  const lastText = last ? `${attemptText(last)}, ${new Date(last.at).toLocaleString()}` : "";
  const row = el(
    "tr",
    { className: "message" },
    cell(el("code", { text: message.id })),
    cell(`${message.channel} / ${message.event}`),
    cell(el("span", { className: "message-status", text: message.status })),
    cell(el("span", { className: "attempts", text: String(message.attempts.length) })),
    el("td", { className: "last-attempt", text: lastText }),
    cell(time(message.next_attempt_at, "")),
    cell(
      button("Retry", `Send the message ${message.id} again`, async () => {
        if (await perform(errorId, () => admin.retryWebhookMessage(endpoint.id, message.id))) await refresh();
      }),
    ),
  );
  row.dataset.messageId = message.id;
  row.dataset.status = message.status;
  return row;
}

// What an attempt came to, in words: "HTTP 204 after 12 ms", "could not connect: connection refused after 1 ms".
function attemptText(attempt) {
  const outcome = attempt.error ?? (attempt.status_code ? `HTTP ${attempt.status_code}` : "no answer");
  return `${outcome} after ${attempt.duration_ms} ms`;
}

async function createEndpoint(event) {
  event.preventDefault();
  const form = $("endpoint-create-form");
  const asked = { url: form.url.value.trim(), channels: split(form.channels.value) };
  const events = split(form.events.value);
  if (events.length) asked.events = events;
  if (form.description.value.trim()) asked.description = form.description.value.trim();
  const created = await attempt("endpoint-error", () => admin.createWebhookEndpoint(asked));
  if (!created) return;
  form.reset();
  showSecret(`The signing secret of ${created.url}. Copy it now: it is not shown again.`, created.secret);
  await loadEndpoints();
}

function showSecret(about, secret) {
  $("endpoint-secret-about").textContent = about;
  $("endpoint-secret").textContent = secret;
  $("endpoint-secret-box").hidden = false;
}

async function setDisabled(endpoint, disabled) {
  const changed = await attempt(`endpoint-error-${endpoint.id}`, () =>
    admin.updateWebhookEndpoint(endpoint.id, { disabled }),
  );
  if (changed) await loadEndpoints();
}

async function rotateSecret(endpoint) {
  const question = `Give ${endpoint.url} a new signing secret? The old one also signs for a while, then stops.`;
  if (!(await confirmAction(question, "Rotate the secret"))) return;
  const secret = await attempt(`endpoint-error-${endpoint.id}`, () => admin.rotateWebhookSecret(endpoint.id));
  if (secret) showSecret(`The new signing secret of ${endpoint.url}. Copy it now: it is not shown again.`, secret);
}

async function deleteEndpoint(endpoint) {
  const question = `Delete the endpoint ${endpoint.url}? Nothing more is sent to it, retries included.`;
  if (!(await confirmAction(question, "Delete the endpoint"))) return;
  if (await perform(`endpoint-error-${endpoint.id}`, () => admin.deleteWebhookEndpoint(endpoint.id))) {
    await loadEndpoints();
  }
}

// ---- Channels: namespaces and members ----

async function loadNamespaces() {
  const namespaces = await attempt("namespace-error", () => admin.namespaces());
  if (!namespaces) return;
  $("namespace-list").tBodies[0].replaceChildren(
    ...namespaces.map((namespace) => {
      const row = el(
        "tr",
        { className: "namespace" },
        cell(el("code", { text: namespace.name })),
        cell(namespace.subscribe === "proxy" ? `proxy: ${namespace.proxy_url}` : namespace.subscribe),
        cell(namespace.publish),
        cell(namespace.presence ? "yes" : "no"),
        cell(namespace.join_leave ? "yes" : "no"),
        cell(
          button("Edit", `Edit the namespace ${namespace.name}`, () => editNamespace(namespace)),
          " ",
          button("Delete", `Delete the namespace ${namespace.name}`, () => deleteNamespace(namespace), "danger"),
        ),
      );
      row.dataset.namespace = namespace.name;
      return row;
    }),
  );
  $("namespace-list").hidden = namespaces.length === 0;
  $("namespaces-empty").hidden = namespaces.length > 0;
}

function editNamespace(namespace) {
  const form = $("namespace-form");
  form.name.value = namespace.name;
  form.subscribe.value = namespace.subscribe;
  form.proxy_url.value = namespace.proxy_url || "";
  form.publish.value = namespace.publish;
  form.presence.checked = namespace.presence;
  form.join_leave.checked = namespace.join_leave;
  form.name.focus();
}

async function putNamespace(event) {
  event.preventDefault();
  const form = $("namespace-form");
  const rules = {
    subscribe: form.subscribe.value,
    publish: form.publish.value,
    presence: form.presence.checked,
    join_leave: form.join_leave.checked,
  };
  if (rules.subscribe === "proxy") rules.proxy_url = form.proxy_url.value.trim();
  const saved = await attempt("namespace-error", () => admin.putNamespace(form.name.value.trim(), rules));
  if (!saved) return;
  form.reset();
  if (saved.proxy_secret) {
    // Made by this save (a namespace that became a proxy one): the only time it is shown.
    $("namespace-secret-about").textContent =
      `The secret that signs the requests to ${saved.proxy_url}. Copy it now: it is not shown again.`;
    $("namespace-secret").textContent = saved.proxy_secret;
    $("namespace-secret-box").hidden = false;
  }
  await loadNamespaces();
}

async function deleteNamespace(namespace) {
  const question = `Delete the namespace ${namespace.name}? Every open subscription to its channels ends.`;
  if (!(await confirmAction(question, "Delete the namespace"))) return;
  await perform("namespace-error", () => admin.deleteNamespace(namespace.name));
  await loadNamespaces();
}

let membersChannel = null;

async function showMembers(channel) {
  const members = await attempt("members-error", () => admin.members(channel));
  if (!members) {
    $("members-panel").hidden = true;
    membersChannel = null;
    return;
  }
  membersChannel = channel;
  $("member-list-caption").textContent = `Members of ${channel}`;
  $("member-list").tBodies[0].replaceChildren(
    ...members.map((member) => {
      const row = el(
        "tr",
        { className: "member" },
        cell(userLink(member.user_id)),
        cell(el("code", { text: member.info === null ? "" : JSON.stringify(member.info) })),
        cell(time(member.expires_at)),
        cell(button("Revoke", `Revoke the grant of ${member.user_id}`, () => revoke(channel, member), "danger")),
      );
      row.dataset.userId = member.user_id;
      return row;
    }),
  );
  $("member-list").hidden = members.length === 0;
  $("members-empty").hidden = members.length > 0;
  $("members-panel").hidden = false;
}

// A user as an administrator types one: an e-mail address (looked up) or an id.
async function userIdOf(text) {
  if (!text.includes("@")) return text;
  const [user] = await admin.users({ email: text });
  if (!user) throw new Error(`No user has the address ${text}.`);
  return user.id;
}

async function grant(event) {
  event.preventDefault();
  const form = $("grant-form");
  const channel = membersChannel;
  const granted = await perform("grant-error", async () => {
    const userId = await userIdOf(form.user.value.trim());
    const options = {};
    if (form.info.value.trim()) {
      let info;
      try {
        info = JSON.parse(form.info.value);
      } catch {
        throw new Error("The info must be a JSON object, e.g. {\"name\": \"Ada\"}.");
      }
      if (info === null || typeof info !== "object" || Array.isArray(info)) {
        throw new Error("The info must be a JSON object, e.g. {\"name\": \"Ada\"}.");
      }
      options.info = info;
    }
    if (form.expires_in.value.trim()) {
      const seconds = Number(form.expires_in.value.trim());
      if (!Number.isInteger(seconds) || seconds <= 0) throw new Error("The expiry must be a whole number of seconds.");
      options.expiresIn = seconds;
    }
    await admin.grant(channel, userId, options);
  });
  if (!granted) return;
  form.reset();
  await showMembers(channel);
}

async function revoke(channel, member) {
  const email = (await emailOf(member.user_id)) ?? member.user_id;
  const question = `Revoke ${email}'s grant of ${channel}? Their open subscriptions to it end within a second.`;
  if (!(await confirmAction(question, "Revoke"))) return;
  await perform("members-error", () => admin.revoke(channel, member.user_id));
  await showMembers(channel);
}

// ---- Trusted issuers ----

const issuers = {
  list: async () => (await client.json("/admin/issuers")).issuers,
  put: (name, body) => client.json(`/admin/issuers/${encodeURIComponent(name)}`, { method: "PUT", body }),
  remove: (name) => client.json(`/admin/issuers/${encodeURIComponent(name)}`, { method: "DELETE" }),
};

function keysOf(issuer) {
  if (issuer.jwks_url) return issuer.jwks_url;
  if (issuer.jwks) return `${issuer.jwks.keys.length} ${issuer.jwks.keys.length === 1 ? "key" : "keys"} given`;
  return "a secret (not shown)";
}

function claimsOf(issuer) {
  const named = [`e-mail: ${issuer.email_claim}`];
  if (issuer.channels_claim) named.push(`channels: ${issuer.channels_claim}`);
  if (issuer.info_claim) named.push(`info: ${issuer.info_claim}`);
  return named.join(", ");
}

async function loadIssuers() {
  const found = await attempt("issuer-error", () => issuers.list());
  if (!found) return;
  $("issuer-list").tBodies[0].replaceChildren(
    ...found.map((issuer) => {
      const row = el(
        "tr",
        { className: "issuer" },
        cell(el("code", { text: issuer.name })),
        cell(issuer.issuer),
        cell(issuer.audience),
        cell(list(issuer.algorithms)),
        el("td", { className: "keys", text: keysOf(issuer) }),
        cell(claimsOf(issuer)),
        cell(time(issuer.created_at)),
        cell(
          button("Edit", `Edit the issuer ${issuer.name}`, () => editIssuer(issuer)),
          " ",
          button("Delete", `Delete the issuer ${issuer.name}`, () => deleteIssuer(issuer), "danger"),
        ),
      );
      row.dataset.issuer = issuer.name;
      return row;
    }),
  );
  $("issuer-list").hidden = found.length === 0;
  $("issuers-empty").hidden = found.length > 0;
}

// Only the chosen kind of keys is asked for (an issuer has exactly one).
function showKeysField() {
  const kind = $("issuer-keys").value;
  for (const field of document.querySelectorAll(".issuer-keys")) field.hidden = field.dataset.keys !== kind;
}

function editIssuer(issuer) {
  const form = $("issuer-form");
  form.name.value = issuer.name;
  form.issuer.value = issuer.issuer;
  form.audience.value = issuer.audience;
  form.algorithms.value = issuer.algorithms.join(", ");
  form.keys.value = issuer.jwks_url ? "jwks_url" : issuer.jwks ? "jwks" : "secret";
  form.jwks_url.value = issuer.jwks_url ?? "";
  form.jwks.value = issuer.jwks ? JSON.stringify(issuer.jwks, null, 2) : "";
  form.secret.value = "";
  form.email_claim.value = issuer.email_claim;
  form.channels_claim.value = issuer.channels_claim ?? "";
  form.info_claim.value = issuer.info_claim ?? "";
  showKeysField();
  form.name.focus();
}

async function putIssuer(event) {
  event.preventDefault();
  const form = $("issuer-form");
  const saved = await attempt("issuer-error", async () => {
    const body = {
      issuer: form.issuer.value.trim(),
      audience: form.audience.value.trim(),
      algorithms: split(form.algorithms.value),
    };
    const kind = form.keys.value;
    if (kind === "jwks_url") body.jwks_url = form.jwks_url.value.trim();
    if (kind === "secret") body.secret = form.secret.value;
    if (kind === "jwks") {
      try {
        body.jwks = JSON.parse(form.jwks.value);
      } catch {
        throw new Error('The JWKS must be JSON: {"keys": [...]}.');
      }
    }
    for (const claim of ["email_claim", "channels_claim", "info_claim"]) {
      if (form[claim].value.trim()) body[claim] = form[claim].value.trim();
    }
    return issuers.put(form.name.value.trim(), body);
  });
  if (!saved) return;
  form.reset();
  showKeysField();
  await loadIssuers();
}

async function deleteIssuer(issuer) {
  const question =
    `Delete the trusted issuer ${issuer.name}? Its tokens are refused from now on, and every session they ` +
    "made ends at once, with its live connections.";
  if (!(await confirmAction(question, "Delete the issuer"))) return;
  await perform("issuer-error", () => issuers.remove(issuer.name));
  await loadIssuers();
}

// ---- Applications (OpenID clients) ----

const oauthClients = {
  path: (id) => `/admin/oauth-clients/${encodeURIComponent(id)}`,
  list: async () => (await client.json("/admin/oauth-clients")).clients,
  create: (body) => client.json("/admin/oauth-clients", { method: "POST", body }),
  rotate: async (id) => (await client.json(`${oauthClients.path(id)}/rotate-secret`, { method: "POST" })).client_secret,
  remove: (id) => client.json(oauthClients.path(id), { method: "DELETE" }),
};

function lines(text) {
  return text
    .split("\n")
    .map((line) => line.trim())
    .filter(Boolean);
}

async function loadOAuthClients() {
  const found = await attempt("oauth-client-error", () => oauthClients.list());
  if (!found) return;
  $("oauth-client-list").tBodies[0].replaceChildren(
    ...found.map((app) => {
      const actions = [button("Delete", `Delete the application ${app.name}`, () => deleteOAuthClient(app), "danger")];
      if (app.type === "confidential") {
        actions.unshift(button("Rotate secret", `Rotate the secret of ${app.name}`, () => rotateOAuthSecret(app)), " ");
      }
      const row = el(
        "tr",
        { className: "oauth-client" },
        cell(app.name),
        cell(el("code", { text: app.client_id })),
        el("td", { className: "type", text: app.first_party ? `${app.type}, first party` : app.type }),
        cell(list(app.redirect_uris)),
        cell(list(app.grant_types)),
        cell(list(app.scopes)),
        cell(time(app.created_at)),
        cell(...actions),
      );
      row.dataset.clientId = app.client_id;
      return row;
    }),
  );
  $("oauth-client-list").hidden = found.length === 0;
  $("oauth-clients-empty").hidden = found.length > 0;
}

function showOAuthSecret(about, secret) {
  $("oauth-client-secret-about").textContent = about;
  $("oauth-client-secret").textContent = secret;
  $("oauth-client-secret-box").hidden = false;
}

async function createOAuthClient(event) {
  event.preventDefault();
  const form = $("oauth-client-form");
  const checked = (name) => [...form.querySelectorAll(`input[name="${name}"]:checked`)].map((box) => box.value);
  const body = {
    name: form.name.value.trim(),
    type: form.type.value,
    redirect_uris: lines(form.redirect_uris.value),
    grant_types: checked("grant_type"),
    scopes: checked("scope"),
    post_logout_redirect_uris: lines(form.post_logout_redirect_uris.value),
    first_party: form.first_party.checked,
  };
  if (form.backchannel_logout_uri.value.trim()) body.backchannel_logout_uri = form.backchannel_logout_uri.value.trim();
  if (form.audience.value.trim()) body.audience = form.audience.value.trim();
  const created = await attempt("oauth-client-error", () => oauthClients.create(body));
  if (!created) return;
  form.reset();
  if (created.client_secret) {
    showOAuthSecret(
      `The secret of ${created.name} (client id ${created.client_id}). Copy it now: it is not shown again.`,
      created.client_secret,
    );
  }
  await loadOAuthClients();
}

async function rotateOAuthSecret(app) {
  const question = `Give ${app.name} a new secret? The old one stops working at once.`;
  if (!(await confirmAction(question, "Rotate the secret"))) return;
  const secret = await attempt("oauth-client-error", () => oauthClients.rotate(app.client_id));
  if (secret) showOAuthSecret(`The new secret of ${app.name}. Copy it now: it is not shown again.`, secret);
}

async function deleteOAuthClient(app) {
  const question =
    `Delete the application ${app.name}? Every session and token issued to it ends at once, and its ` +
    "users must sign in again once it is registered anew.";
  if (!(await confirmAction(question, "Delete the application"))) return;
  await perform("oauth-client-error", () => oauthClients.remove(app.client_id));
  await loadOAuthClients();
}

// ---- The audit log ----

let auditFilters = {};
const auditLog = new AuditTable(
  $("audit-log"),
  (before) => admin.audit({ ...auditFilters, before, limit: AUDIT_PAGE }),
  "audit-error",
);

async function filterAudit(event) {
  event?.preventDefault();
  const form = $("audit-form");
  const filters = await attempt("audit-error", async () => {
    const subject = form.subject.value.trim();
    const actor = form.actor.value.trim();
    return {
      subject: subject ? await userIdOf(subject) : undefined,
      type: form.type.value || undefined,
      actor: actor ? await userIdOf(actor) : undefined,
    };
  });
  if (!filters) return;
  auditFilters = filters;
  await auditLog.reload();
}

function clearAudit() {
  $("audit-form").reset();
  auditFilters = {};
  auditLog.reload();
}

// ---- Start ----

function start() {
  client.loggedIn(); // the server sent this page to a signed-in administrator
  $("user-find-form").addEventListener("submit", findUser);
  $("user-find-email").addEventListener("input", searchAsTyped);
  $("user-newest-button").addEventListener("click", () => newestUsers(false));
  $("user-more-button").addEventListener("click", () => newestUsers(true));
  $("user-role-button").addEventListener("click", changeRole);
  $("user-end-sessions-button").addEventListener("click", endSessions);
  $("user-reset-mfa-button").addEventListener("click", resetMfa);
  $("user-delete-button").addEventListener("click", deleteUser);
  $("org-more-button").addEventListener("click", () => loadOrgs(true));
  $("key-create-form").addEventListener("submit", createKey);
  $("key-created-done").addEventListener("click", () => {
    $("key-created").hidden = true;
    $("key-secret").textContent = "";
  });
  $("endpoint-create-form").addEventListener("submit", createEndpoint);
  $("endpoint-secret-done").addEventListener("click", () => {
    $("endpoint-secret-box").hidden = true;
    $("endpoint-secret").textContent = "";
  });
  $("namespace-form").addEventListener("submit", putNamespace);
  $("namespace-secret-done").addEventListener("click", () => {
    $("namespace-secret-box").hidden = true;
    $("namespace-secret").textContent = "";
  });
  $("members-form").addEventListener("submit", (event) => {
    event.preventDefault();
    showMembers($("members-channel").value.trim());
  });
  $("grant-form").addEventListener("submit", grant);
  $("issuer-form").addEventListener("submit", putIssuer);
  $("issuer-keys").addEventListener("change", showKeysField);
  $("oauth-client-form").addEventListener("submit", createOAuthClient);
  $("oauth-client-secret-done").addEventListener("click", () => {
    $("oauth-client-secret-box").hidden = true;
    $("oauth-client-secret").textContent = "";
  });
  $("audit-form").addEventListener("submit", filterAudit);
  $("audit-clear-button").addEventListener("click", clearAudit);
  addEventListener("hashchange", route);
  route();
  if (!location.hash || location.hash === "#users") newestUsers(false);
}

start();
