/**
 * The reference client of the auth-rt service: an ES module with no dependencies, for the service's
 * own page and for pages on other origins that the service lists in `ALLOWED_ORIGINS`.
 *
 * Logged in by password, passkey or OAuth, tokens live only in the service's HttpOnly cookies: this script
 * never sees one and stores nothing in localStorage or sessionStorage. On a 401 it refreshes once (POST /auth/refresh sends the refresh
 * cookie) and retries the request once. Refreshes are serialised across the tabs of a browser, so two
 * tabs never present the same refresh token (the server would take the second for a stolen token and
 * end the session): with the Web Locks API where the browser has it, otherwise with a promise chain in
 * the tab plus a claim-and-release protocol between tabs over a BroadcastChannel.
 *
 * Users of the application's own identity provider (Auth0, Clerk, Supabase, Keycloak, its own login):
 * given `subjectToken`, a function that returns the application's token for the user, the client logs in
 * by RFC 8693 token exchange ({@link Client#exchange}, POST /oauth/token) and, instead of refreshing,
 * exchanges a fresh application token again shortly before the access token would expire, so the
 * application's word stays the source of truth. Its tokens then travel in the body by default and are
 * kept in this object's memory only (never in any storage), sent as `Authorization: Bearer`; each tab
 * has a session of its own (its id, which is no credential, is kept in sessionStorage so that the exchange
 * after a reload ends the session it replaces).
 *
 * Events: {@link EventFeed} follows the user's channels by server-sent events, WebSocket, long polling or
 * polling, and always resumes from the last cursor, so reconnecting or switching transports loses and
 * repeats nothing. Every event is delivered whatever its name: the SSE stream is read with fetch() and
 * parsed here (EventSource would only deliver the names it listens for).
 *
 * Channels: beyond `user:<id>` and `broadcast`, a feed follows named channels (`<namespace>:<name>`) that
 * {@link EventFeed#subscribe} adds and {@link EventFeed#unsubscribe} removes while it runs: by frames on a
 * WebSocket, by reconnecting with `?channels=` and the cursor on the other transports. A channel whose
 * access ends is reported to `onUnsubscribed`; `presence.join` and `presence.leave` events (and each entry of a
 * presence_diff namespace's `presence.diff`) to `onJoin` and `onLeave`. {@link Client#presence} says who is in
 * a channel now.
 *
 * Passkeys: {@link Client#registerPasskey}, {@link Client#loginWithPasskey} (also with the browser's
 * conditional mediation, passkeys offered in an input's autofill) and
 * {@link Client#reauthenticateWithPasskey} run the WebAuthn ceremonies with the browser; options and
 * credentials travel in WebAuthn Level 3's JSON forms, converted by the browser where it can
 * (`PublicKeyCredential.parse*OptionsFromJSON`, `toJSON()`) and by a small base64url fallback here.
 *
 * Activity and administration: {@link Client#activity} pages through the user's own audit entries;
 * {@link Admin} wraps the administrators' endpoints (users, API keys, webhook endpoints, namespaces and
 * members, the audit log), on which the admin console is built.
 *
 * @module client
 */

const REFRESH_LOCK = "auth-rt-refresh";
const LONG_POLL_SECONDS = 20;
const LONG_POLL_PAUSE_MS = 500;
const POLL_INTERVAL_MS = 1000;
const BACKOFF_START_MS = 250;
const BACKOFF_CAP_MS = 5000;
// A stream that lived at least this long counts as healthy: the next drop reconnects at once.
const HEALTHY_STREAM_MS = 2000;
// Without Web Locks: how long a tab waits for other tabs' claims before it refreshes, and how long a
// claim is honoured when its tab never releases it (closed mid-refresh).
const CLAIM_WINDOW_MS = 50;
const CLAIM_MAX_MS = 10_000;
// Token exchange (RFC 8693): the grant, and the prefix of its token type names.
const TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange";
const TOKEN_TYPE_PREFIX = "urn:ietf:params:oauth:token-type:";
// An exchanged session is exchanged again this long before its access token expires (at most half its
// life): a hidden tab's timers may run up to a minute late, and the token must not lapse meanwhile.
const RENEW_BEFORE_MS = 60_000;
// After a renewal that failed for a passing reason (network, 429, 5xx, the token function threw).
const RENEW_RETRY_START_MS = 1000;
const RENEW_RETRY_CAP_MS = 30_000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * A connection state, as shown to the user.
 * - `connecting`: opening the first connection;
 * - `live`: connected, events arrive as they are published;
 * - `reconnecting`: the connection dropped; the feed reconnects by itself and resumes from its cursor;
 * - `offline`: stopped (not started, stopped, logged out) or the browser is offline.
 * @typedef {"connecting" | "live" | "reconnecting" | "offline"} ConnectionState
 */

/**
 * How events are received.
 * @typedef {"sse" | "websocket" | "long-poll" | "poll"} Transport
 */

/**
 * An event as the service delivers it.
 * @typedef {object} ServiceEvent
 * @property {string} id the event's id in its channel
 * @property {string} channel `user:<id>`, `broadcast`, `<namespace>:<name>`
 * @property {string} [from] the id of the user who published it; absent when an API key, the command line
 *   or a webhook published it (and for join and leave events)
 * @property {string} event its name; any name the service accepts, known to this client or not
 * @property {*} data any JSON value
 * @property {string} ts when it was published (RFC 3339, UTC)
 */

/**
 * A member of a channel as join and leave events and presence describe one.
 * @typedef {object} ChannelMember
 * @property {string} user_id
 * @property {*} info what the channel's grant says of the user (`null` without a grant or info)
 */

/**
 * Who is in a channel now (GET /channels/{channel}/presence).
 * @typedef {object} Presence
 * @property {string} channel
 * @property {number} count how many users are present (all of them, also beyond the 1,000 in `users`)
 * @property {Array<ChannelMember & {connections: number}>} users sorted by user id; `connections` counts
 *   the user's SSE and WebSocket connections reading the channel
 */

/**
 * Why a channel stopped being followed: `revoked` (its grant was deleted), `expired` (its grant ran out),
 * `namespace_deleted`, or `access_changed` (access ended another way, or was found refused on reconnecting).
 * @typedef {"revoked" | "expired" | "namespace_deleted" | "access_changed"} UnsubscribeReason
 */

/**
 * A user as the service describes one.
 * @typedef {object} User
 * @property {string} id
 * @property {string | null} email null for a user of a trusted issuer whose token named no address
 * @property {string} role `user` or `admin`
 * @property {boolean} email_verified whether the address was confirmed (mailed link, or the OAuth provider)
 * @property {boolean} mfa_enabled whether logging in needs a TOTP code too
 * @property {{issuer: string, sub: string}} [external] for a user made by a token exchange: the trusted
 *   issuer's name here and the `sub` its tokens give the user
 */

/**
 * What GET /auth/status answers: always 200, with or without a session.
 * @typedef {object} SessionStatus
 * @property {User | null} user the logged-in user, or null when no valid access token came
 * @property {string | null} session_id the session's id, with `user`
 * @property {string | null} org_id the session's active organization while the user is a member, with `user`
 * @property {boolean} can_refresh a refresh cookie came: without `user`, {@link Client#refresh} may
 *   open the session again (it can still fail when that session has ended)
 */

/**
 * One audit entry: a security-relevant change, who made it, about whom, from where.
 * @typedef {object} AuditEntry
 * @property {string} id its id; ids order by time
 * @property {string} at when (RFC 3339, UTC)
 * @property {string} type e.g. `login.succeeded`, `mfa.reset`, `api_key.created`
 * @property {{kind: "user" | "api_key" | "cli" | "system", id: string | null}} actor who made the change
 * @property {string} [subject] the id of the user the entry is about
 * @property {string} [ip] the client's address (absent for the command line and the service itself)
 * @property {object} details what changed (never a secret)
 */

/**
 * A page of audit entries, newest first.
 * @typedef {object} AuditPage
 * @property {AuditEntry[]} entries
 * @property {string | null} next pass it as `before` for the next (older) page; null when nothing older matches
 */

/**
 * One of the user's passkeys, as the service describes it (never its key).
 * @typedef {object} Passkey
 * @property {string} id its credential id (base64url)
 * @property {string} name what the user called it
 * @property {string} created_at when it was registered (RFC 3339, UTC)
 * @property {string | null} last_used_at when it last logged in; null until then
 */

// 401s that say a submitted secret was wrong, not that the session is gone: no refresh, no logout.
const WRONG_SECRET_CODES = new Set(["invalid_credentials", "invalid_mfa_code", "mfa_required"]);

/**
 * An error answer of the service.
 */
export class ServiceError extends Error {
  /**
   * @param {number} status the HTTP status
   * @param {string} code the error's `code`, e.g. `invalid_credentials`
   * @param {string} message the error's human text
   */
  constructor(status, code, message, details = {}) {
    super(message);
    this.name = "ServiceError";
    /** @type {number} */
    this.status = status;
    /** @type {string} */
    this.code = code;
    /** @type {string | undefined} with code `mfa_required`: pass it to {@link Client#loginMfa} */
    this.mfaToken = details.mfa_token;
  }

  /**
   * The error a non-2xx response carries (a generic one when its body is not the service's JSON error).
   * @param {Response} response
   * @returns {Promise<ServiceError>}
   */
  static async from(response) {
    try {
      const body = await response.json();
      if (typeof body.error === "string") {
        // The token endpoint answers in OAuth's shape (RFC 6749): {"error": "<code>", "error_description"}.
        return new ServiceError(response.status, body.error, body.error_description ?? body.error, body);
      }
      return new ServiceError(response.status, body.error.code, body.error.message, body);
    } catch {
      return new ServiceError(response.status, "http_error", `The service answered ${response.status}.`);
    }
  }
}

/**
 * Options of {@link Client}.
 * @typedef {object} ClientOptions
 * @property {string} [baseUrl] where the service is, e.g. `https://auth.example.com` (a path prefix is
 *   kept: `https://example.com/rt`). Default: the page's own origin. When it is another origin, requests
 *   carry credentials (`credentials: "include"`) and that origin must list the page's in `ALLOWED_ORIGINS`.
 * @property {() => void} [onLoggedOut] called once when a signed-in session is found to be gone (a 401
 *   that a refresh could not cure): logged out elsewhere, session ended, refresh token expired; for an
 *   exchanged session also when the application's token is refused or `subjectToken` answers no token.
 * @property {() => (string | null | Promise<string | null>)} [subjectToken] the application's token for
 *   the user (an ID token or access token of its identity provider, or a JWT of its own backend), from a
 *   trusted issuer of the service: makes {@link Client#exchange} available, and every renewal of the
 *   session exchanges a token it returns (call it fresh each time: the provider's SDK caches and renews).
 *   Answering null or "" says that nobody is logged in to the application: the session here ends. A
 *   function that throws is asked again a little later.
 * @property {string} [subjectTokenType] what `subjectToken` returns: `jwt` (default), `id_token` or
 *   `access_token`, or the full `urn:ietf:params:oauth:token-type:` name
 * @property {"body" | "cookie"} [tokenTransport] with `subjectToken`: `body` (default) keeps the tokens in
 *   this object's memory and sends them as `Authorization: Bearer`, so the page may be on any site the
 *   service lists in `ALLOWED_ORIGINS` (no WebSocket: a browser cannot send the header on a handshake);
 *   `cookie` puts them in the service's HttpOnly cookies, which needs the page on the same site as the
 *   service, and allows every transport
 */

/**
 * Options of {@link Client#request}.
 * @typedef {object} RequestOptions
 * @property {string} [method] default `GET`
 * @property {*} [body] sent as JSON when given
 * @property {Record<string, string>} [headers] extra request headers
 * @property {AbortSignal} [signal] aborts the request
 */

/** The session: authenticated requests with refresh-on-401, log in (or exchange the application's token) and out. */
export class Client {
  /** @param {ClientOptions} [options] */
  constructor({
    baseUrl = location.origin,
    onLoggedOut = () => {},
    subjectToken,
    subjectTokenType = "jwt",
    tokenTransport = "body",
  } = {}) {
    const base = new URL(baseUrl, location.href);
    // A trailing slash, so relative resolution keeps a path prefix ("https://x/rt" + "auth/me").
    if (!base.pathname.endsWith("/")) base.pathname += "/";
    /** @type {URL} the service's address, ending in "/" */
    this.baseUrl = base;
    /** @type {boolean} true when the service is on another origin than the page */
    this.crossOrigin = base.origin !== location.origin;
    if (subjectToken !== undefined && typeof subjectToken !== "function") {
      throw new TypeError("subjectToken must be a function that returns the application's token");
    }
    if (!["body", "cookie"].includes(tokenTransport)) throw new TypeError("tokenTransport must be body or cookie");
    this.subjectToken = subjectToken ?? null;
    this.subjectTokenType = subjectTokenType.startsWith("urn:") ? subjectTokenType : TOKEN_TYPE_PREFIX + subjectTokenType;
    /** @type {boolean} true when tokens travel in memory as a bearer token, not in cookies */
    this.bearer = this.subjectToken !== null && tokenTransport === "body";
    /** @type {RequestCredentials} */
    this.credentials = this.bearer ? "omit" : this.crossOrigin ? "include" : "same-origin";
    this.onLoggedOut = onLoggedOut;
    /** @type {boolean} whether the client believes a session is open (set by login, me, loggedIn) */
    this.signedIn = false;
    this.refreshing = null;
    // An exchanged session: its access token (body transport; never stored anywhere but here), its id,
    // the device name it was given, and the timer of its renewal.
    this.accessToken = null;
    /** @type {string | null} the id of the session the last exchange opened */
    this.sessionId = null;
    this.device = undefined;
    this.renewing = null;
    this.renewTimer = null;
    this.renewAttempts = 0;
    this.expiresAt = 0;
  }

  /**
   * The absolute URL of a service path.
   * @param {string} path e.g. `/events?cursor=...`
   * @returns {URL}
   */
  url(path) {
    return new URL(path.replace(/^\/+/, ""), this.baseUrl);
  }

  /**
   * fetch() with the session cookies (or an exchanged session's bearer token); on a 401, one refresh (for an
   * exchanged session: one exchange) and one retry. Network failures reject (as fetch does); HTTP errors
   * resolve with the response.
   * @param {string} path a service path, e.g. `/auth/sessions`
   * @param {RequestOptions} [options]
   * @returns {Promise<Response>}
   */
  async request(path, { method = "GET", body, headers = {}, signal } = {}) {
    const init = { method, credentials: this.credentials, headers: { ...headers }, signal };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const url = this.url(path);
    const sent = this.accessToken;
    let response = await fetch(url, this.authorized(init));
    if (response.status === 401 && !path.startsWith("/auth/login") && !(await wrongSecret(response))) {
      // A token renewed while this request was under way is simply used: no second renewal for it.
      const renewed = this.accessToken !== null && this.accessToken !== sent;
      if (renewed || (await this.refresh())) response = await fetch(url, this.authorized(init));
      if (response.status === 401 && !(await wrongSecret(response))) this.loggedOut();
    }
    return response;
  }

  /**
   * `init` with the exchanged access token as a bearer token, when the client holds one.
   * @private
   */
  authorized(init) {
    if (!this.accessToken) return init;
    return { ...init, headers: { ...init.headers, Authorization: `Bearer ${this.accessToken}` } };
  }

  /**
   * {@link Client#request} for a JSON answer: resolves with the parsed body (null without one), rejects
   * with a {@link ServiceError} on any non-2xx answer.
   * @param {string} path
   * @param {RequestOptions} [options]
   * @returns {Promise<*>}
   */
  async json(path, options) {
    const response = await this.request(path, options);
    if (!response.ok) throw await ServiceError.from(response);
    const text = await response.text(); // 204, and 202 (accepted), have no body
    return text ? JSON.parse(text) : null;
  }

  /**
   * Logs in with the cookie transport (the tokens go into HttpOnly cookies, never to script).
   * @param {{email: string, password: string, device?: string}} credentials
   * @returns {Promise<User>} the user; rejects with a {@link ServiceError} (e.g. 401
   *   `invalid_credentials`, 401 `mfa_required`, 429 `rate_limited`)
   */
  async login({ email, password, device }) {
    const body = { email, password, transport: "cookie", ...(device ? { device } : {}) };
    const { user } = await this.json("/auth/login", { method: "POST", body });
    this.loggedIn();
    return user;
  }

  /**
   * The second step of a login for an account with MFA: after {@link Client#login} rejected with
   * `mfa_required`, present its `mfaToken` and a code from the authenticator app (or a recovery code).
   * @param {{mfaToken: string, code?: string, recoveryCode?: string, device?: string}} second
   * @returns {Promise<User>} rejects with a {@link ServiceError} (401 `invalid_mfa_code`; 400
   *   `invalid_token` when the attempt expired, was used, or had five wrong codes: log in again)
   */
  async loginMfa({ mfaToken, code, recoveryCode, device }) {
    const body = { mfa_token: mfaToken, transport: "cookie", ...(device ? { device } : {}) };
    if (recoveryCode !== undefined) body.recovery_code = recoveryCode;
    else body.code = code;
    const { user } = await this.json("/auth/login/mfa", { method: "POST", body });
    this.loggedIn();
    return user;
  }

  /**
   * Asks for a password-reset mail. Resolves alike whether or not an account has the address.
   * @param {string} email
   * @returns {Promise<void>}
   */
  async forgotPassword(email) {
    await this.json("/auth/password/forgot", { method: "POST", body: { email } });
  }

  /**
   * Sets a new password with the token from a reset mail; every session of the account ends.
   * @param {string} token
   * @param {string} newPassword
   * @returns {Promise<void>} rejects with a {@link ServiceError} (400 `invalid_token`, 422 `validation_failed`)
   */
  async resetPassword(token, newPassword) {
    await this.json("/auth/password/reset", { method: "POST", body: { token, new_password: newPassword } });
  }

  /**
   * Whether a reset mail's token would still set a password, asked without using it up.
   * @param {string} token
   * @returns {Promise<boolean>} false for a used, expired or replaced token (400 `invalid_token`); rejects
   *   with a {@link ServiceError} for anything else (429 `rate_limited`, 503 `unavailable`)
   */
  async checkResetToken(token) {
    try {
      await this.json("/auth/password/reset/check", { method: "POST", body: { token } });
      return true;
    } catch (error) {
      if (error instanceof ServiceError && error.code === "invalid_token") return false;
      throw error;
    }
  }

  /**
   * Confirms the account's address with the token from a verification mail.
   * @param {string} token
   * @returns {Promise<void>} rejects with a {@link ServiceError} (400 `invalid_token`)
   */
  async verifyEmail(token) {
    await this.json("/auth/email/verify", { method: "POST", body: { token } });
  }

  /**
   * Mails the logged-in user a new verification link.
   * @returns {Promise<void>}
   */
  async resendVerification() {
    await this.json("/auth/email/verify/resend", { method: "POST" });
  }

  /**
   * Proves the password again: for five minutes this session may change its second factor.
   * @param {string} password
   * @returns {Promise<void>} rejects with a {@link ServiceError} (401 `invalid_credentials`)
   */
  async reauthenticate(password) {
    await this.json("/auth/reauthenticate", { method: "POST", body: { password } });
  }

  /**
   * Starts setting up TOTP: a secret for the authenticator app (text, otpauth:// URI and SVG QR code).
   * Rejects with 403 `reauthentication_required` unless the session logged in or re-authenticated in the
   * last five minutes ({@link Client#reauthenticate}).
   * @returns {Promise<{secret: string, otpauth_uri: string, qr_svg: string}>}
   */
  setupTotp() {
    return this.json("/auth/mfa/totp/setup", { method: "POST" });
  }

  /**
   * Turns TOTP on with a current code; resolves with the ten recovery codes, shown only this once.
   * @param {string} code
   * @returns {Promise<string[]>}
   */
  async confirmTotp(code) {
    return (await this.json("/auth/mfa/totp/confirm", { method: "POST", body: { code } })).recovery_codes;
  }

  /**
   * Turns TOTP off; needs the password and a current code (or a recovery code).
   * @param {{password: string, code?: string, recoveryCode?: string}} proof
   * @returns {Promise<void>}
   */
  async disableTotp({ password, code, recoveryCode }) {
    const body = { password, ...(recoveryCode !== undefined ? { recovery_code: recoveryCode } : { code }) };
    await this.json("/auth/mfa/totp", { method: "DELETE", body });
  }

  /**
   * Creates a passkey for the logged-in user on this device (the browser asks the user to confirm, by
   * fingerprint, face, PIN or a security key) and registers it with the service.
   * Rejects with a {@link ServiceError} 403 `reauthentication_required` unless the session logged in or
   * re-authenticated in the last five minutes ({@link Client#reauthenticate},
   * {@link Client#reauthenticateWithPasskey}), or 409 `conflict` for a passkey registered already; and
   * with the browser's DOMException when the user cancels (`NotAllowedError`) or this authenticator
   * holds a passkey of the account already (`InvalidStateError`).
   * @param {{name?: string}} [options] a name to tell it by (default: `Passkey <date>`)
   * @returns {Promise<Passkey>}
   */
  async registerPasskey({ name } = {}) {
    const { options } = await this.json("/auth/passkeys/register/options", { method: "POST" });
    const credential = await navigator.credentials.create({ publicKey: creationOptionsFromJSON(options) });
    const body = { credential: credentialToJSON(credential), ...(name ? { name } : {}) };
    return this.json("/auth/passkeys", { method: "POST", body });
  }

  /**
   * Logs in with a passkey (cookie transport): no password, and no TOTP code even where MFA is on.
   * With `conditional`, the browser offers the account's passkeys among the autofill suggestions of an
   * input with `autocomplete="username webauthn"` and resolves only once the user picks one; abort it
   * with `signal` when the user logs in otherwise (it aborts the wait for the user, not a login already
   * proved). See {@link conditionalMediationAvailable}.
   * @param {{email?: string, conditional?: boolean, signal?: AbortSignal, device?: string}} [options]
   *   `email` is sent as a hint only: the service answers the same for every address
   * @returns {Promise<User>} rejects with a {@link ServiceError} (401 `invalid_credentials`, 403
   *   `email_not_verified`, 429 `rate_limited`) or the browser's DOMException (`NotAllowedError` when
   *   the user cancels, `AbortError` when `signal` aborts)
   */
  async loginWithPasskey({ email, conditional = false, signal, device } = {}) {
    const { credential, login_id } = await this.passkeyAssertion({ email, conditional, signal });
    const body = { login_id, credential, transport: "cookie", ...(device ? { device } : {}) };
    // Not aborted from here on: the user has chosen a passkey, and the login it proves should finish.
    const { user } = await this.json("/auth/passkeys/login", { method: "POST", body });
    this.loggedIn();
    return user;
  }

  /**
   * Proves a passkey of the logged-in user again: for five minutes this session may add passkeys and
   * change its second factor (as {@link Client#reauthenticate} with the password).
   * @returns {Promise<void>} rejects with a {@link ServiceError} (401 `invalid_credentials`: not a
   *   passkey of this account; the session goes on) or the browser's DOMException
   */
  async reauthenticateWithPasskey() {
    const { credential, login_id } = await this.passkeyAssertion({});
    await this.json("/auth/reauthenticate", { method: "POST", body: { login_id, credential } });
  }

  /**
   * The logged-in user's passkeys, oldest first.
   * @returns {Promise<Passkey[]>}
   */
  async listPasskeys() {
    return (await this.json("/auth/passkeys")).passkeys;
  }

  /**
   * Renames one of the logged-in user's passkeys.
   * @param {string} id
   * @param {string} name 1-64 characters
   * @returns {Promise<Passkey>} rejects with a {@link ServiceError} (404, 422 `validation_failed`)
   */
  renamePasskey(id, name) {
    return this.json(`/auth/passkeys/${encodeURIComponent(id)}`, { method: "PATCH", body: { name } });
  }

  /**
   * Removes one of the logged-in user's passkeys: it no longer logs in (the authenticator may still
   * offer it until the user deletes it there too).
   * @param {string} id
   * @returns {Promise<void>}
   */
  async deletePasskey(id) {
    await this.json(`/auth/passkeys/${encodeURIComponent(id)}`, { method: "DELETE" });
  }

  /**
   * Login options from the service, answered by the browser: the assertion's JSON and its login_id.
   * @private
   */
  async passkeyAssertion({ email, conditional = false, signal }) {
    const body = email ? { email } : {};
    const { options, login_id } = await this.json("/auth/passkeys/login/options", { method: "POST", body, signal });
    const request = { publicKey: requestOptionsFromJSON(options), signal };
    if (conditional) request.mediation = "conditional";
    const credential = await navigator.credentials.get(request);
    return { credential: credentialToJSON(credential), login_id };
  }

  /**
   * Creates an account (then log in with {@link Client#login}).
   * @param {{email: string, password: string}} credentials
   * @returns {Promise<User>} rejects with a {@link ServiceError} (409 `conflict`, 422 `validation_failed`)
   */
  async register({ email, password }) {
    return (await this.json("/auth/register", { method: "POST", body: { email, password } })).user;
  }

  /**
   * Whether a session is open, asked of GET /auth/status: it answers 200 with or without one, so a page's
   * first look logs no 401 in the console. Neither refreshes nor marks the session open or gone.
   * @returns {Promise<SessionStatus>} rejects with a {@link ServiceError} (503 `unavailable`)
   */
  async status() {
    const response = await fetch(this.url("/auth/status"), this.authorized({ credentials: this.credentials }));
    if (!response.ok) throw await ServiceError.from(response);
    return response.json();
  }

  /**
   * The logged-in user, refreshing the access token if need be. Asks {@link Client#status} first and
   * refreshes only when it reports a refresh cookie, so a visitor who never logged in causes no 401.
   * @returns {Promise<User | null>} null when no session is open
   */
  async me() {
    const status = await this.status();
    let { user } = status;
    const renewable = status.can_refresh || (this.subjectToken !== null && this.signedIn);
    if (!user && renewable && (await this.refresh())) ({ user } = await this.status());
    if (!user) {
      this.loggedOut();
      return null;
    }
    this.loggedIn();
    return user;
  }

  /**
   * Ends this session (this device), or every session of the user with `everywhere`.
   * @param {{everywhere?: boolean}} [options]
   * @returns {Promise<void>}
   */
  async logout({ everywhere = false } = {}) {
    await this.json(everywhere ? "/auth/logout-all" : "/auth/logout", { method: "POST" });
    this.signedIn = false;
    this.forgetExchange();
  }

  /**
   * Logs in with the application's token (option `subjectToken`), by RFC 8693 token exchange at
   * `POST /oauth/token`: the service checks it against its trusted issuers and opens a session for the
   * user that issuer and the token's `sub` name (made at the first exchange). From then on the client
   * exchanges a fresh application token again shortly before the access token would expire, instead of
   * refreshing, and once more on a 401; the session it replaces is ended (live feeds reconnect with the
   * new one and resume from their cursor). Channels the token lists (the issuer's `channels_claim`) are
   * granted and taken back at each exchange.
   * @param {{device?: string}} [options] `device` names the session in the user's device list
   * @returns {Promise<User>} rejects with a {@link ServiceError} (400 `invalid_grant`: the token was refused,
   *   expired, or of no trusted issuer; 400 `invalid_request`; 403 `csrf_rejected` with `tokenTransport:
   *   "cookie"` from a page the service does not list; 429 `rate_limited`), or a TypeError when
   *   `subjectToken` is missing or answers no token
   */
  async exchange({ device } = {}) {
    if (!this.subjectToken) throw new TypeError("exchange() needs the subjectToken option");
    this.device = device;
    const user = await this.renew();
    if (!user) throw new TypeError("subjectToken() answered no token: nobody is logged in to the application");
    return user;
  }

  /**
   * Exchanges a fresh application token now (as the client does by itself before the access token
   * expires), one exchange at a time; the session it replaces ends.
   * @returns {Promise<User | null>} the user, or null when `subjectToken` answered no token (the session
   *   then ends); rejects as {@link Client#exchange}
   */
  renew() {
    if (!this.renewing) {
      this.renewing = this.exchangeOnce().finally(() => {
        this.renewing = null;
      });
    }
    return this.renewing;
  }

  /** @private */
  async exchangeOnce() {
    const subjectToken = await this.subjectToken();
    if (!subjectToken) {
      await this.endExchangedSession();
      return null;
    }
    const form = new URLSearchParams({
      grant_type: TOKEN_EXCHANGE,
      subject_token: subjectToken,
      subject_token_type: this.subjectTokenType,
      transport: this.bearer ? "body" : "cookie",
    });
    if (this.device) form.set("device", this.device);
    // A form is a simple request: no preflight; the service's CORS answer lets the page read it.
    const response = await fetch(this.url("/oauth/token"), { method: "POST", body: form, credentials: this.credentials });
    if (!response.ok) throw await ServiceError.from(response);
    const answer = await response.json();
    const replaced = this.sessionId ?? this.rememberedSession();
    this.accessToken = answer.access_token ?? null; // the refresh token is not kept: renewals exchange
    this.sessionId = answer.session_id;
    this.rememberSession(this.sessionId);
    this.expiresAt = Date.now() + answer.expires_in * 1000;
    this.renewAttempts = 0;
    this.scheduleRenewal(Math.max(answer.expires_in * 500, answer.expires_in * 1000 - RENEW_BEFORE_MS));
    this.loggedIn();
    if (replaced && replaced !== this.sessionId) {
      // The replaced session (this tab's, also from before a reload) would otherwise stay among the
      // user's devices until its refresh token expired. 404 for another user's: nothing to do.
      await this.once(`/auth/sessions/${encodeURIComponent(replaced)}`, "DELETE").catch(() => {});
    }
    return answer.user;
  }

  /**
   * A request with the current credentials, once: no refresh or renewal on a 401 (for use inside one).
   * @private
   */
  once(path, method) {
    return fetch(this.url(path), this.authorized({ method, credentials: this.credentials }));
  }

  /**
   * The id of the session this tab last opened by exchange, kept across a reload in sessionStorage (an
   * id names a session but cannot use it: it is no credential), so the next exchange ends it.
   * @private
   */
  rememberedSession() {
    try {
      return sessionStorage.getItem(this.sessionKey());
    } catch {
      return null; // storage unavailable (a sandboxed frame, storage turned off): a reload's session lingers
    }
  }

  /** @private */
  rememberSession(id) {
    try {
      if (id) sessionStorage.setItem(this.sessionKey(), id);
      else sessionStorage.removeItem(this.sessionKey());
    } catch {
      // as above
    }
  }

  /** @private */
  sessionKey() {
    return `auth-rt-exchanged-session ${this.baseUrl.href}`;
  }

  /** @private */
  scheduleRenewal(ms) {
    clearTimeout(this.renewTimer);
    this.renewTimer = setTimeout(() => this.renewInTime(), ms);
  }

  /**
   * The timer's renewal. A refused token ends the session; a passing failure (network, 429, 5xx, a token
   * function that threw) is tried again with back-off while the access token lasts.
   * @private
   */
  async renewInTime() {
    try {
      await this.renew();
    } catch (error) {
      if (!this.signedIn) return;
      if (error instanceof ServiceError && error.status >= 400 && error.status < 500 && error.status !== 429) {
        await this.endExchangedSession();
        return;
      }
      this.renewAttempts += 1;
      const wait = Math.min(RENEW_RETRY_CAP_MS, RENEW_RETRY_START_MS * 2 ** (this.renewAttempts - 1));
      // Past the access token's expiry the next request's 401 asks again, and ends the session if need be.
      if (Date.now() + wait < this.expiresAt) this.scheduleRenewal(wait);
    }
  }

  /**
   * The application no longer vouches for the user: end the session here and tell the page.
   * @private
   */
  async endExchangedSession() {
    if (this.signedIn) await this.once("/auth/logout", "POST").catch(() => {});
    this.forgetExchange();
    this.loggedOut();
  }

  /** @private */
  forgetExchange() {
    clearTimeout(this.renewTimer);
    this.renewTimer = null;
    this.accessToken = null;
    if (this.sessionId) this.rememberSession(null);
    this.sessionId = null;
  }

  /**
   * Publishes an event (POST /events): to `user:<your id>`, to a named channel whose namespace lets
   * subscribers publish and that the user may subscribe to, or as an admin to any channel. The event
   * carries `from`: the user's id.
   * @param {string} channel
   * @param {string} event its name: 1-100 letters, digits or `_.:-`
   * @param {*} data any JSON value
   * @returns {Promise<{id: string, channel: string}>} rejects with a {@link ServiceError} (403
   *   `forbidden`, 404 `not_found` for a namespace that does not exist, 413, 422)
   */
  publish(channel, event, data) {
    return this.json("/events", { method: "POST", body: { channel, event, data } });
  }

  /**
   * Who is in a channel now: users with at least one SSE or WebSocket connection reading it. A user may
   * ask of a channel it may subscribe to whose namespace has `presence: true`.
   * @param {string} channel `<namespace>:<name>`
   * @returns {Promise<Presence>} rejects with a {@link ServiceError} (403 `forbidden`; 404 `not_found`:
   *   no such namespace, or one without presence)
   */
  presence(channel) {
    return this.json(`/channels/${encodeURIComponent(channel)}/presence`);
  }

  /**
   * The named channels the user is granted (members namespaces), as GET /channels lists them.
   * @returns {Promise<string[]>}
   */
  async channels() {
    return (await this.json("/channels")).channels;
  }

  /**
   * Makes one of the user's organizations the session's active one, or none with `null` (`POST /auth/org`):
   * the access tokens issued from then on carry its `org_id` and `org_role`. The answer rotates the
   * session's refresh token as a refresh does, so it is sent under the same lock as refreshes: two tabs
   * never present one refresh token.
   * @param {string | null} orgId
   * @returns {Promise<object>} the session's answer `T` (with the cookie transport, without the tokens);
   *   rejects with a {@link ServiceError} (403 `forbidden`: not a member)
   */
  async switchOrg(orgId) {
    const send = () =>
      withRefreshLock(() =>
        fetch(
          this.url("/auth/org"),
          this.authorized({
            method: "POST",
            credentials: this.credentials,
            headers: { "Content-Type": "application/json" },
            body: JSON.stringify({ org_id: orgId }),
          }),
        ),
      );
    // Not through request(): its refresh on a 401 takes the same lock, so it runs after, outside it.
    let response = await send();
    if (response.status === 401 && (await this.refresh())) response = await send();
    if (response.status === 401) this.loggedOut();
    if (!response.ok) throw await ServiceError.from(response);
    const answer = await response.json();
    if (this.bearer && answer.access_token) this.accessToken = answer.access_token;
    return answer;
  }

  /**
   * A page of the user's own activity (GET /auth/activity): the audit entries about them, newest first:
   * logins (and refused ones), sessions ended, password, MFA and passkey changes.
   * @param {{before?: string, limit?: number}} [page] `before`: the `next` of the page before
   * @returns {Promise<AuditPage>}
   */
  activity({ before, limit } = {}) {
    return this.json(`/auth/activity${queryString({ before, limit })}`);
  }

  /**
   * Refreshes the session's tokens, one refresh at a time across every tab of the browser.
   * @returns {Promise<boolean>} true when the session is valid again
   */
  refresh() {
    if (!this.refreshing && this.subjectToken) {
      this.refreshing = this.renewAfterRefusal().finally(() => {
        this.refreshing = null;
      });
    }
    if (!this.refreshing) {
      this.refreshing = withRefreshLock(async () => {
        // Another tab may have refreshed while this one waited. /auth/status, not /auth/me: it answers
        // 200 either way, so this check logs no 401 when the access token is gone.
        const check = await fetch(this.url("/auth/status"), { credentials: this.credentials });
        if (check.ok && (await check.json()).user) return true;
        const response = await fetch(this.url("/auth/refresh"), { method: "POST", credentials: this.credentials });
        return response.ok;
      }).finally(() => {
        this.refreshing = null;
      });
    }
    return this.refreshing;
  }

  /**
   * An exchanged session's "refresh": a new exchange, once a session was opened by one. With cookies,
   * another tab may have renewed already (then the session is valid again as it is).
   * @private
   */
  async renewAfterRefusal() {
    if (!this.signedIn) return false;
    try {
      if (!this.bearer) {
        const check = await fetch(this.url("/auth/status"), { credentials: this.credentials });
        if (check.ok && (await check.json()).user) return true;
      }
      return (await this.renew()) !== null;
    } catch {
      return false;
    }
  }

  /** Marks the session as open, so a later unrecoverable 401 calls `onLoggedOut`. */
  loggedIn() {
    this.signedIn = true;
  }

  /** Marks the session as gone and calls `onLoggedOut` (once per session). */
  loggedOut() {
    if (this.signedIn) {
      this.signedIn = false;
      this.forgetExchange();
      this.onLoggedOut();
    }
  }
}

/**
 * A user as administrators see one: {@link User} and when the account was made.
 * @typedef {User & {created_at: string | null}} AdminUser
 */

/**
 * A logged-in device of a user.
 * @typedef {object} Session
 * @property {string} id
 * @property {string | null} device the name the login gave it
 * @property {string | null} created_at
 * @property {string | null} last_used_at
 * @property {string | null} ip
 * @property {boolean} current whether it is the caller's own session (never, for another user's)
 */

/**
 * An API key as the service lists it (never the key itself).
 * @typedef {object} ApiKey
 * @property {string} id
 * @property {string} name
 * @property {string[]} scopes `events:publish`, `tokens:introspect`, `webhooks:manage`, `channels:manage`,
 *   `audit:read`, `issuers:manage`, `clients:manage`, `orgs:manage`
 * @property {string[]} channels where `events:publish` may publish
 * @property {string} created_at
 * @property {string | null} last_used_at
 */

/**
 * An outgoing webhook endpoint (its secret only when made or rotated).
 * @typedef {object} WebhookEndpoint
 * @property {string} id
 * @property {string} url
 * @property {string[]} channels
 * @property {string[] | null} events name patterns (`order.*`); null: every event
 * @property {string | null} description
 * @property {boolean} disabled
 * @property {string} created_at
 */

/**
 * One event on its way to one endpoint; `id` is the `webhook-id` it is sent with.
 * @typedef {object} WebhookMessage
 * @property {string} id
 * @property {string} event_id
 * @property {string} channel
 * @property {string} event
 * @property {"pending" | "delivered" | "failed"} status
 * @property {Array<{at: string, status_code: number | null, duration_ms: number, error: string | null}>} attempts
 * @property {string | null} next_attempt_at
 */

/**
 * A namespace's rules.
 * @typedef {object} Namespace
 * @property {string} name
 * @property {"members" | "authenticated" | "proxy"} subscribe `proxy`: the granted users, and those the
 *   application's backend at `proxy_url` allows when they subscribe
 * @property {"server" | "subscribers"} publish
 * @property {boolean} presence
 * @property {boolean} join_leave
 * @property {string} [proxy_url] a `proxy` namespace's: where the service asks
 * @property {string} [proxy_secret] `whsec_...`, the secret that signs those requests: only in the answer
 *   of the save that made it (shown once)
 */

/**
 * A trusted issuer: an identity provider (or the application's own backend) whose tokens
 * {@link Client#exchange} turns into sessions. Its HMAC `secret`, if it has one, is never shown.
 * @typedef {object} Issuer
 * @property {string} name its name here (1-32 of `a-z0-9_-`), as in a user's `external.issuer`
 * @property {string} issuer the tokens' `iss`
 * @property {string} audience what the tokens' `aud` must be or contain
 * @property {string[]} algorithms e.g. `["RS256"]`
 * @property {string | null} jwks_url where its public keys are fetched
 * @property {{keys: object[]} | null} jwks its public keys, when given inline
 * @property {string} email_claim the claim holding the user's e-mail address (default `email`)
 * @property {string | null} channels_claim a claim listing channels each exchange grants
 * @property {string | null} info_claim a claim whose object becomes those grants' `info`
 * @property {string} created_at
 */

/**
 * The administration API (admin endpoints of the service) for a {@link Client} signed in as an
 * administrator: users, API keys, outgoing webhook endpoints, namespaces and channel members, trusted
 * issuers, the audit log. The admin console (`/admin`) is built on it. Every method rejects with a {@link ServiceError}
 * (403 `forbidden` for a caller who is not an administrator, 404 `not_found`, 409 `conflict` when the
 * last administrator would be demoted or deleted, 422 `validation_failed`).
 */
export class Admin {
  /** @param {Client} client */
  constructor(client) {
    this.client = client;
  }

  /**
   * Users newest first, the one with an e-mail address, or (`q`) the first 50 in e-mail order whose address
   * starts with `q`, in any letter case. `q` goes alone.
   * @param {{email?: string, q?: string, limit?: number, offset?: number}} [query]
   * @returns {Promise<AdminUser[]>}
   */
  async users({ email, q, limit, offset } = {}) {
    return (await this.client.json(`/admin/users${queryString({ email, q, limit, offset })}`)).users;
  }

  /**
   * One user by id, with their live sessions and their passkeys.
   * @param {string} id
   * @returns {Promise<{user: AdminUser, sessions: Session[], passkeys: Passkey[]}>}
   */
  user(id) {
    return this.client.json(`/admin/users/${encodeURIComponent(id)}`);
  }

  /**
   * Changes a user's role; it applies on their next request.
   * @param {string} id
   * @param {"user" | "admin"} role
   * @returns {Promise<AdminUser>}
   */
  async setRole(id, role) {
    return (await this.client.json(`/admin/users/${encodeURIComponent(id)}`, { method: "PATCH", body: { role } })).user;
  }

  /**
   * Logs a user out on every device (their live connections close).
   * @param {string} id
   * @returns {Promise<void>}
   */
  async endSessions(id) {
    await this.client.json(`/admin/users/${encodeURIComponent(id)}/sessions`, { method: "DELETE" });
  }

  /**
   * Turns a user's two-factor authentication off (secret and recovery codes gone, every session ended,
   * the owner mailed): for an owner who lost their phone.
   * @param {string} id
   * @returns {Promise<void>}
   */
  async resetMfa(id) {
    await this.client.json(`/admin/users/${encodeURIComponent(id)}/mfa/reset`, { method: "POST" });
  }

  /**
   * Deletes a user and every record of theirs; their sessions end at once.
   * @param {string} id
   * @returns {Promise<void>}
   */
  async deleteUser(id) {
    await this.client.json(`/admin/users/${encodeURIComponent(id)}`, { method: "DELETE" });
  }

  /** @returns {Promise<ApiKey[]>} every API key */
  async apiKeys() {
    return (await this.client.json("/admin/api-keys")).api_keys;
  }

  /**
   * Creates an API key; the answer's `key` is the only time the key itself is shown.
   * @param {{name: string, scopes: string[], channels?: string[]}} key
   * @returns {Promise<ApiKey & {key: string}>}
   */
  createApiKey({ name, scopes, channels = [] }) {
    return this.client.json("/admin/api-keys", { method: "POST", body: { name, scopes, channels } });
  }

  /**
   * Deletes an API key: it stops working at once, everywhere.
   * @param {string} id
   * @returns {Promise<void>}
   */
  async deleteApiKey(id) {
    await this.client.json(`/admin/api-keys/${encodeURIComponent(id)}`, { method: "DELETE" });
  }

  /** @returns {Promise<WebhookEndpoint[]>} every outgoing webhook endpoint, oldest first */
  async webhookEndpoints() {
    return (await this.client.json("/admin/webhook-endpoints")).endpoints;
  }

  /**
   * Creates an outgoing webhook endpoint; the answer's `secret` is shown this once.
   * @param {{url: string, channels: string[], events?: string[], description?: string}} endpoint
   * @returns {Promise<WebhookEndpoint & {secret: string}>}
   */
  createWebhookEndpoint(endpoint) {
    return this.client.json("/admin/webhook-endpoints", { method: "POST", body: endpoint });
  }

  /**
   * Changes any of an endpoint's `url`, `channels`, `events`, `description`, `disabled`.
   * @param {string} id
   * @param {object} changes
   * @returns {Promise<WebhookEndpoint>}
   */
  updateWebhookEndpoint(id, changes) {
    return this.client.json(`/admin/webhook-endpoints/${encodeURIComponent(id)}`, { method: "PATCH", body: changes });
  }

  /**
   * Deletes an endpoint: nothing more is sent to it.
   * @param {string} id
   * @returns {Promise<void>}
   */
  async deleteWebhookEndpoint(id) {
    await this.client.json(`/admin/webhook-endpoints/${encodeURIComponent(id)}`, { method: "DELETE" });
  }

  /**
   * Gives an endpoint a new secret (shown this once); the old one also signs for a while.
   * @param {string} id
   * @returns {Promise<string>}
   */
  async rotateWebhookSecret(id) {
    const path = `/admin/webhook-endpoints/${encodeURIComponent(id)}/rotate-secret`;
    return (await this.client.json(path, { method: "POST" })).secret;
  }

  /**
   * An endpoint's messages, newest first (`pending`: the backlog, oldest first).
   * @param {string} id
   * @param {{status?: "pending" | "delivered" | "failed", limit?: number}} [query]
   * @returns {Promise<WebhookMessage[]>}
   */
  async webhookMessages(id, { status, limit } = {}) {
    const path = `/admin/webhook-endpoints/${encodeURIComponent(id)}/messages${queryString({ status, limit })}`;
    return (await this.client.json(path)).messages;
  }

  /**
   * Sends one message again now (same `webhook-id`, a fresh retry schedule).
   * @param {string} id the endpoint's
   * @param {string} messageId
   * @returns {Promise<void>} rejects with 409 `conflict` for a disabled endpoint
   */
  async retryWebhookMessage(id, messageId) {
    const path = `/admin/webhook-endpoints/${encodeURIComponent(id)}/messages/${encodeURIComponent(messageId)}/retry`;
    await this.client.json(path, { method: "POST" });
  }

  /**
   * Sends every matching event since a cursor or a time again.
   * @param {string} id
   * @param {{cursor: string} | {since: string}} from `since`: an RFC 3339 time
   * @returns {Promise<number>} how many messages were queued
   */
  async replayWebhooks(id, from) {
    const path = `/admin/webhook-endpoints/${encodeURIComponent(id)}/replay`;
    return (await this.client.json(path, { method: "POST", body: from })).messages;
  }

  /** @returns {Promise<Namespace[]>} every namespace, by name */
  async namespaces() {
    return (await this.client.json("/admin/namespaces")).namespaces;
  }

  /**
   * Creates a namespace or replaces its rules.
   * @param {string} name 1-32 of `a-z0-9_-`
   * @param {{subscribe: string, publish: string, presence?: boolean, join_leave?: boolean, proxy_url?: string,
   *   rotate_proxy_secret?: boolean}} rules `proxy_url` with `subscribe: "proxy"`
   * @returns {Promise<Namespace>} with `proxy_secret` when this save made one (the only time it is shown)
   */
  putNamespace(name, rules) {
    return this.client.json(`/admin/namespaces/${encodeURIComponent(name)}`, { method: "PUT", body: rules });
  }

  /**
   * Deletes a namespace; its channels' open subscriptions end.
   * @param {string} name
   * @returns {Promise<void>}
   */
  async deleteNamespace(name) {
    await this.client.json(`/admin/namespaces/${encodeURIComponent(name)}`, { method: "DELETE" });
  }

  /**
   * A channel's granted members.
   * @param {string} channel `<namespace>:<name>`
   * @returns {Promise<Array<{user_id: string, info: *, expires_at: string | null}>>}
   */
  async members(channel) {
    return (await this.client.json(`/channels/${encodeURIComponent(channel)}/members`)).members;
  }

  /**
   * Grants one user one channel.
   * @param {string} channel
   * @param {string} userId
   * @param {{info?: object, expiresIn?: number}} [grant] `info` shows in presence (at most 1 KiB);
   *   `expiresIn`: seconds
   * @returns {Promise<void>}
   */
  async grant(channel, userId, { info, expiresIn } = {}) {
    const body = { ...(info !== undefined ? { info } : {}), ...(expiresIn !== undefined ? { expires_in: expiresIn } : {}) };
    await this.client.json(`/channels/${encodeURIComponent(channel)}/members/${encodeURIComponent(userId)}`, {
      method: "PUT",
      body,
    });
  }

  /**
   * Revokes a user's grant of a channel: their open subscriptions to it end within a second.
   * @param {string} channel
   * @param {string} userId
   * @returns {Promise<void>}
   */
  async revoke(channel, userId) {
    const path = `/channels/${encodeURIComponent(channel)}/members/${encodeURIComponent(userId)}`;
    await this.client.json(path, { method: "DELETE" });
  }

  /** @returns {Promise<Issuer[]>} every trusted issuer */
  async issuers() {
    return (await this.client.json("/admin/issuers")).issuers;
  }

  /**
   * Trusts an issuer's tokens for {@link Client#exchange}, or replaces what is known of it.
   * @param {string} name 1-32 of `a-z0-9_-`
   * @param {{issuer: string, audience: string, algorithms: string[], jwks_url?: string, jwks?: object,
   *   secret?: string, email_claim?: string, channels_claim?: string, info_claim?: string}} issuer exactly
   *   one of `jwks_url`, `jwks` and `secret`
   * @returns {Promise<Issuer>}
   */
  putIssuer(name, issuer) {
    return this.client.json(`/admin/issuers/${encodeURIComponent(name)}`, { method: "PUT", body: issuer });
  }

  /**
   * Stops trusting an issuer: every session its tokens opened ends, with its live connections.
   * @param {string} name
   * @returns {Promise<void>}
   */
  async deleteIssuer(name) {
    await this.client.json(`/admin/issuers/${encodeURIComponent(name)}`, { method: "DELETE" });
  }

  /**
   * A page of the audit log, newest first.
   * @param {{subject?: string, type?: string, actor?: string, before?: string, limit?: number}} [query]
   *   `subject`: a user id; `actor`: a user id, an API key id, `cli` or `system`; `before`: the `next`
   *   of the page before
   * @returns {Promise<AuditPage>}
   */
  audit({ subject, type, actor, before, limit } = {}) {
    return this.client.json(`/admin/audit${queryString({ subject, type, actor, before, limit })}`);
  }
}

/** `?a=1&b=2` of the parameters that are given (none: the empty string). */
function queryString(params) {
  const given = Object.entries(params).filter(([, value]) => value !== undefined && value !== null && value !== "");
  const text = new URLSearchParams(given.map(([name, value]) => [name, String(value)])).toString();
  return text ? `?${text}` : "";
}

// Without Web Locks (older browsers): one refresh at a time within the tab, and between tabs a claim
// announced on a BroadcastChannel. A tab claims, listens for a short window, and yields to any claim it
// heard that sorts before its own (claims sort by time); a tab that hears a claim waits for its release.
// A tab answers a claim it has not heard before with its own current claim, so a tab that opened while
// another was refreshing learns of it. Where even BroadcastChannel is missing, only the tab is serialised.
class TabMutex {
  constructor(name) {
    this.channel = new BroadcastChannel(name);
    this.claims = new Map(); // other tabs' claims: claim -> when it stops being honoured
    this.waiters = [];
    this.mine = null;
    this.channel.onmessage = ({ data }) => {
      if (data?.type === "claim") {
        const news = !this.claims.has(data.claim);
        this.claims.set(data.claim, Date.now() + CLAIM_MAX_MS);
        if (news && this.mine) this.channel.postMessage({ type: "claim", claim: this.mine });
      } else if (data?.type === "release") {
        this.claims.delete(data.claim);
      }
      this.waiters.splice(0).forEach((wake) => wake());
    };
    addEventListener("pagehide", () => this.mine && this.channel.postMessage({ type: "release", claim: this.mine }));
  }

  othersClaiming(before) {
    const now = Date.now();
    for (const [claim, until] of this.claims) if (until < now) this.claims.delete(claim);
    return [...this.claims.keys()].some((claim) => before === undefined || claim < before);
  }

  changed(ms) {
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      setTimeout(resolve, ms);
    });
  }

  async run(task) {
    for (;;) {
      while (this.othersClaiming()) await this.changed(CLAIM_WINDOW_MS * 4);
      // Time first, so the earlier claim wins; the random part breaks ties.
      const random = crypto.getRandomValues(new Uint32Array(2)).join("");
      const claim = `${Date.now().toString(36).padStart(10, "0")}:${random}`;
      this.mine = claim;
      this.channel.postMessage({ type: "claim", claim });
      await sleep(CLAIM_WINDOW_MS);
      const yielded = this.othersClaiming(claim);
      try {
        if (!yielded) return await task();
      } finally {
        this.channel.postMessage({ type: "release", claim });
        this.mine = null;
      }
    }
  }
}

/** Whether a 401 says a submitted password or code was wrong (the session itself may be fine). */
async function wrongSecret(response) {
  try {
    const { error } = await response.clone().json();
    return WRONG_SECRET_CODES.has(error?.code);
  } catch {
    return false;
  }
}

/**
 * Whether this browser can create and use passkeys here: WebAuthn in a secure context, on a page whose host
 * is a domain name (browsers bind passkeys to one, never to an IP address such as 127.0.0.1).
 * @returns {boolean}
 */
export function passkeysSupported() {
  const host = globalThis.location?.hostname ?? "";
  const ipAddress = /^\d+(\.\d+){3}$/.test(host) || host.includes(":") || host.startsWith("[");
  return (
    !ipAddress && typeof globalThis.PublicKeyCredential === "function" && !!globalThis.navigator?.credentials?.create
  );
}

/**
 * Whether {@link Client#loginWithPasskey} may run with `conditional: true` here (the browser offers
 * passkeys in an input's autofill).
 * @returns {Promise<boolean>}
 */
export async function conditionalMediationAvailable() {
  if (!passkeysSupported() || typeof PublicKeyCredential.isConditionalMediationAvailable !== "function") return false;
  return PublicKeyCredential.isConditionalMediationAvailable().catch(() => false);
}

// WebAuthn Level 3's JSON forms (binary fields as base64url without padding), with the browser's own
// PublicKeyCredential.parse*OptionsFromJSON and toJSON() where it has them, and this small fallback
// where it does not.

function fromBase64url(text) {
  const binary = atob(text.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(text.length / 4) * 4, "="));
  return Uint8Array.from(binary, (char) => char.charCodeAt(0)).buffer;
}

function toBase64url(buffer) {
  const bytes = ArrayBuffer.isView(buffer)
    ? new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength)
    : new Uint8Array(buffer);
  let binary = "";
  for (const byte of bytes) binary += String.fromCharCode(byte);
  return btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function descriptorsFromJSON(descriptors = []) {
  return descriptors.map((descriptor) => ({ ...descriptor, id: fromBase64url(descriptor.id) }));
}

function creationOptionsFromJSON(json) {
  if (typeof PublicKeyCredential.parseCreationOptionsFromJSON === "function") {
    return PublicKeyCredential.parseCreationOptionsFromJSON(json);
  }
  return {
    ...json,
    challenge: fromBase64url(json.challenge),
    user: { ...json.user, id: fromBase64url(json.user.id) },
    excludeCredentials: descriptorsFromJSON(json.excludeCredentials),
  };
}

function requestOptionsFromJSON(json) {
  if (typeof PublicKeyCredential.parseRequestOptionsFromJSON === "function") {
    return PublicKeyCredential.parseRequestOptionsFromJSON(json);
  }
  return { ...json, challenge: fromBase64url(json.challenge), allowCredentials: descriptorsFromJSON(json.allowCredentials) };
}

function credentialToJSON(credential) {
  if (typeof credential.toJSON === "function") return credential.toJSON();
  const { response } = credential;
  const json = {
    id: credential.id,
    rawId: toBase64url(credential.rawId),
    type: credential.type,
    authenticatorAttachment: credential.authenticatorAttachment ?? null,
    clientExtensionResults: credential.getClientExtensionResults?.() ?? {},
    response: { clientDataJSON: toBase64url(response.clientDataJSON) },
  };
  if (response.attestationObject) {
    json.response.attestationObject = toBase64url(response.attestationObject);
    json.response.transports = response.getTransports?.() ?? [];
  } else {
    json.response.authenticatorData = toBase64url(response.authenticatorData);
    json.response.signature = toBase64url(response.signature);
    json.response.userHandle = response.userHandle ? toBase64url(response.userHandle) : null;
  }
  return json;
}

let tabChain = Promise.resolve();
// Listening from the start, so the claims of tabs that refresh before this one are heard.
const tabMutex =
  !globalThis.navigator?.locks?.request && typeof BroadcastChannel === "function" ? new TabMutex(REFRESH_LOCK) : null;

function withRefreshLock(task) {
  if (globalThis.navigator?.locks?.request) return navigator.locks.request(REFRESH_LOCK, task);
  const run = tabChain.then(() => (tabMutex ? tabMutex.run(task) : task()));
  tabChain = run.catch(() => {});
  return run;
}

/**
 * Options of {@link EventFeed}.
 * @typedef {object} EventFeedOptions
 * @property {(event: ServiceEvent) => void} onEvent called for every event, in order, exactly once,
 *   whatever its name (the service's `reset` event included: history was lost past an old cursor; join
 *   and leave events too, before `onJoin` and `onLeave`)
 * @property {(state: ConnectionState, transport: Transport | null) => void} [onState] called on every
 *   change of connection state
 * @property {string | null} [cursor] where to resume; default: the present (no history)
 * @property {string[]} [channels] named channels (`<namespace>:<name>`) to follow from the start, beside
 *   the user's own `user:<id>` and `broadcast`
 * @property {(channel: string, member: ChannelMember, event: ServiceEvent) => void} [onJoin] a user became
 *   present in a followed channel (its `presence.join` event, or its entry in a `presence.diff`)
 * @property {(channel: string, member: ChannelMember, event: ServiceEvent) => void} [onLeave] a user stopped
 *   being present (its `presence.leave` event, or its entry in a `presence.diff`)
 * @property {(channel: string, reason: UnsubscribeReason) => void} [onUnsubscribed] the service stopped
 *   sending a channel because the user's access to it ended; the feed no longer follows it, and the rest
 *   goes on
 */

// Answers to a request with `?channels=` that refuse the channels (or one of them), not the session.
const CHANNEL_REFUSALS = new Set([400, 403, 404, 422]);
// The HTTP status an error frame's code stands for, so a WebSocket refusal reads as a request's would.
const CODE_STATUS = {
  bad_request: 400,
  forbidden: 403,
  not_found: 404,
  payload_too_large: 413,
  validation_failed: 422,
  rate_limited: 429,
  unavailable: 503,
};

/**
 * The user's live events (their `user:<id>` channel, `broadcast`, and the named channels subscribed)
 * by any of the four transports.
 */
export class EventFeed {
  /**
   * @param {Client} client
   * @param {EventFeedOptions} options
   */
  constructor(
    client,
    {
      onEvent,
      onState = () => {},
      cursor = null,
      channels = [],
      onJoin = () => {},
      onLeave = () => {},
      onUnsubscribed = () => {},
    },
  ) {
    this.client = client;
    this.onEvent = onEvent;
    this.onStateChange = onState;
    this.onJoin = onJoin;
    this.onLeave = onLeave;
    this.onUnsubscribed = onUnsubscribed;
    /** @type {string | null} where the feed resumes: after the last event delivered, or where its connection
     * (or a channel's subscription) started if none came since */
    this.cursor = cursor;
    /** @type {Transport | null} */
    this.transport = null;
    /** @type {ConnectionState} */
    this.state = "offline";
    this.generation = 0;
    this.attempts = 0;
    this.running = false;
    this.named = new Set(channels);
    // Changes of the channel set the next accepted connection confirms (or its refusal undoes), and
    // requests sent as WebSocket frames, waiting for their answer frame.
    this.pending = [];
    this.framed = [];
    this.socket = null;
    this.welcomed = false;
  }

  /** @type {string[]} the named channels followed (subscribed and not unsubscribed or revoked) */
  get channels() {
    return [...this.named];
  }

  /**
   * Starts following (or switches transport), resuming from the cursor.
   * @param {Transport} transport
   */
  start(transport) {
    if (!Object.hasOwn(this.runners(), transport)) throw new TypeError(`unknown transport: ${transport}`);
    if (transport === "websocket" && this.client.bearer) {
      // A browser sends no Authorization header on a WebSocket handshake: only cookies authenticate one.
      throw new TypeError("websocket needs the cookie transport; with tokens in memory use sse, long-poll or poll");
    }
    this.halt();
    this.transport = transport;
    this.running = true;
    this.attempts = 0;
    this.setState("connecting");
    this.run();
  }

  /**
   * Kept for pages written for the EventSource-based client, which had to name each event to receive it.
   * @deprecated every event arrives on every transport; this does nothing
   * @param {string} _name
   */
  listen(_name) {}

  /** Stops following; the cursor and the channels are kept, so a later start resumes where this one stopped. */
  stop() {
    this.running = false;
    this.halt();
    this.settlePending();
    this.setState("offline");
  }

  /**
   * Follows a named channel too. On a WebSocket a `subscribe` frame asks for it; on the other transports
   * the feed reconnects with the new set of channels and its cursor (nothing of the other channels is
   * lost or repeated). The channel's events start at the present. While the feed is stopped the channel
   * is only noted: {@link EventFeed#start} asks for it, and a refusal then reaches `onUnsubscribed`.
   * @param {string} channel `<namespace>:<name>`
   * @returns {Promise<void>} resolves once the service follows it; rejects with a {@link ServiceError}
   *   (403 `forbidden`, 404 `not_found` for a namespace that does not exist, 400 `bad_request` for a
   *   malformed name, 422 `validation_failed` past the channels a connection may follow), and the feed
   *   goes on without it
   */
  subscribe(channel) {
    return this.change("subscribe", channel);
  }

  /**
   * Stops following a named channel (by an `unsubscribe` frame, or by reconnecting without it).
   * @param {string} channel
   * @returns {Promise<void>}
   */
  unsubscribe(channel) {
    return this.change("unsubscribe", channel);
  }

  /**
   * Publishes an event: as a `publish` frame when the feed is connected by WebSocket, otherwise with
   * {@link Client#publish}. The event carries `from`: the user's id.
   * @param {string} channel `user:<your id>`, or a named channel the user may publish to
   * @param {string} event its name: 1-100 letters, digits or `_.:-`
   * @param {*} data any JSON value
   * @returns {Promise<{id: string, channel: string}>} rejects with a {@link ServiceError}; a WebSocket
   *   that closes before the answer rejects with an Error (the event may or may not be published)
   */
  async publish(channel, event, data) {
    if (!this.welcomed) return this.client.publish(channel, event, data);
    const { id } = await this.send({ type: "publish", channel, event, data });
    return { id, channel };
  }

  /** @private */
  runners() {
    return { sse: this.sse, websocket: this.reopenWebSocket, "long-poll": this.longPoll, poll: this.poll };
  }

  /** @private */
  run() {
    const generation = ++this.generation;
    this.runners()[this.transport].call(this, generation);
  }

  /** @private */
  halt() {
    this.generation++;
    if (this.socket) {
      this.socket.onclose = null;
      this.socket.close(1000);
      this.socketGone();
    }
    this.abort?.abort();
    this.abort = null;
  }

  /**
   * The WebSocket is gone: changes it was asked for wait for the next connection (it carries them in
   * `?channels=`); publishes it was asked for are lost to view.
   * @private
   */
  socketGone() {
    this.socket = null;
    this.welcomed = false;
    for (const request of this.framed.splice(0)) {
      if (request.op === "publish") {
        const lost = "The connection closed before the service answered: the event may or may not be published.";
        request.reject(new Error(lost));
      } else {
        this.pending.push(request);
      }
    }
  }

  /** @private */
  setState(state) {
    if (state === "reconnecting" && globalThis.navigator?.onLine === false) state = "offline";
    if (state === this.state) return;
    this.state = state;
    this.onStateChange(state, this.transport);
  }

  /** @private */
  live(generation) {
    return generation === this.generation;
  }

  /** @private */
  deliver(event, cursor) {
    if (cursor) this.cursor = cursor;
    this.onEvent(event);
    // Join and leave events are the service's: one with `from` was published by a user (the service
    // refuses those names now; a history written before may still hold one), and says nothing of presence.
    if (event.from !== undefined) return;
    if (event.event === "presence.join") this.onJoin(event.channel, event.data, event);
    else if (event.event === "presence.leave") this.onLeave(event.channel, event.data, event);
    else if (event.event === "presence.diff") {
      // A presence_diff namespace's joins and leaves, sent together: each user is in one of the two lists.
      for (const member of event.data.leaves || []) this.onLeave(event.channel, member, event);
      for (const member of event.data.joins || []) this.onJoin(event.channel, member, event);
    }
  }

  /**
   * The service stopped sending a channel (its `unsubscribed` notice, with the reason): only ever called for
   * the service's own notice (an SSE message without `id:`, a WebSocket frame of type `unsubscribed`),
   * never for an event that happens to bear that name.
   * @private
   */
  revoked({ channel, reason }) {
    if (typeof channel !== "string" || !this.named.delete(channel)) return;
    this.onUnsubscribed(channel, reason);
  }

  /** @private */
  change(op, channel) {
    if (typeof channel !== "string" || !channel) return Promise.reject(new TypeError("a channel name is expected"));
    const waiting = [...this.framed, ...this.pending].findLast((request) => request.channel === channel);
    if (waiting?.op === op) return waiting.promise;
    if (this.named.has(channel) === (op === "subscribe")) return Promise.resolve();
    if (op === "subscribe") this.named.add(channel);
    else this.named.delete(channel);
    if (this.welcomed) return this.send({ type: op, channel }).then(() => {});
    if (!this.running) return Promise.resolve();
    const request = this.request(op, channel);
    this.pending.push(request);
    this.attempts = 0;
    this.halt();
    this.run(); // the same transport again, with the new set and the cursor
    return request.promise;
  }

  /** @private */
  request(op, channel) {
    const request = { op, channel };
    request.promise = new Promise((resolve, reject) => {
      request.resolve = resolve;
      request.reject = reject;
    });
    return request;
  }

  /**
   * A frame that the service answers (`subscribed`, `unsubscribed`, `ack` or `error`).
   * @private
   */
  send(frame) {
    const request = this.request(frame.type, frame.channel);
    this.framed.push(request);
    this.socket.send(JSON.stringify(frame));
    return request.promise;
  }

  /**
   * The answer to a frame: the oldest request it can answer.
   * @private
   */
  answered(frame) {
    const answers = (request) => {
      if (frame.type === "subscribed") return request.op === "subscribe" && request.channel === frame.channel;
      if (frame.type === "unsubscribed") return request.op === "unsubscribe" && request.channel === frame.channel;
      if (frame.type === "ack") return request.op === "publish";
      return frame.channel === undefined || request.channel === frame.channel; // an error
    };
    const index = this.framed.findIndex(answers);
    if (index < 0) return;
    const [request] = this.framed.splice(index, 1);
    // It covers what was sent before it and the new channel from its start: kept, a reconnect before the
    // channel's first event resumes it from there rather than at a later present.
    if (frame.type === "subscribed" && frame.cursor) this.cursor = frame.cursor;
    if (frame.type !== "error") return request.resolve(frame);
    const status = CODE_STATUS[frame.code] ?? 400;
    if (request.op !== "publish") this.undo(request);
    request.reject(new ServiceError(status, frame.code, frame.message));
  }

  /** @private */
  undo(request) {
    if (request.op === "subscribe") this.named.delete(request.channel);
    else this.named.add(request.channel);
  }

  /**
   * A connection with the current channels was accepted: the changes it carries are done.
   * @private
   */
  accepted() {
    for (const request of this.pending.splice(0)) request.resolve();
  }

  /** @private */
  settlePending() {
    this.accepted(); // noted: the next start asks for them
    for (const request of this.framed.splice(0)) request.reject(new Error("The feed stopped."));
  }

  /**
   * A request with the current channels was refused (400, 403, 404 or 422): find which channels, by
   * asking for each alone. A refused channel that a pending subscribe added rejects that subscribe;
   * one followed so far (its access ended while no connection could say so) is reported to
   * `onUnsubscribed`. Past the number of channels a connection may follow (422), the pending changes
   * are undone. Resolves with whether the set changed (then reconnect at once).
   * @private
   */
  async refused(response, signal) {
    if (response.status === 422) {
      const error = await ServiceError.from(response);
      const undone = this.pending.splice(0).reverse();
      for (const request of undone) {
        this.undo(request);
        request.reject(error);
      }
      return undone.length > 0;
    }
    let changed = false;
    for (const channel of [...this.named]) {
      const answer = await this.client.request(`/events?${new URLSearchParams({ channels: channel })}`, { signal });
      if (!CHANNEL_REFUSALS.has(answer.status)) continue;
      this.named.delete(channel);
      changed = true;
      const index = this.pending.findIndex((request) => request.op === "subscribe" && request.channel === channel);
      if (index >= 0) this.pending.splice(index, 1)[0].reject(await ServiceError.from(answer));
      else this.onUnsubscribed(channel, answer.status === 404 ? "namespace_deleted" : "access_changed");
    }
    return changed;
  }

  /** @private */
  backoff() {
    this.attempts += 1;
    return Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS * 2 ** (this.attempts - 1));
  }

  /** @private */
  query(extra = {}, { cursor = true } = {}) {
    const params = new URLSearchParams(extra);
    if (this.named.size) params.set("channels", [...this.named].join(","));
    if (cursor && this.cursor) params.set("cursor", this.cursor);
    const text = params.toString();
    return text ? `?${text}` : "";
  }

  /**
   * A 401 that refreshing did not cure: the session is gone. Stops (the client calls onLoggedOut).
   * @private
   */
  sessionGone(generation) {
    if (this.live(generation)) this.stop();
  }

  /**
   * Without a cursor the stream would start at the present of each connection, and events published
   * between a first connection and a reconnection would be lost: take the present's cursor first.
   * @private
   */
  async ensureCursor(signal) {
    if (this.cursor) return;
    const response = await this.client.request(`/events${this.query({ limit: 1 })}`, { signal });
    if (response.status === 401) return;
    if (response.status === 204) {
      this.cursor = response.headers.get("Event-Cursor");
    } else if (response.ok) {
      const body = await response.json();
      for (const event of body.events) this.deliver(event);
      this.cursor = body.cursor;
    }
  }

  /**
   * Server-sent events, read with fetch() so that every event name arrives. Resumes with `?cursor=`;
   * reconnects when the stream ends (the access token expired: the request refreshes it) or fails.
   * @private
   */
  async sse(generation) {
    while (this.live(generation)) {
      this.abort = new AbortController();
      const { signal } = this.abort;
      const opened = Date.now();
      let retryMs = null;
      let ended = false;
      try {
        await this.ensureCursor(signal);
        if (!this.live(generation)) return;
        const response = await this.client.request(`/events/stream${this.query()}`, {
          headers: { Accept: "text/event-stream" },
          signal,
        });
        if (response.status === 401) return this.sessionGone(generation);
        if (CHANNEL_REFUSALS.has(response.status) && this.named.size && (await this.refused(response, signal))) {
          continue; // at once, with the channels that remain
        }
        if (!response.ok || !response.body) throw new Error(`stream answered ${response.status}`);
        if (!this.live(generation)) return;
        this.accepted();
        this.setState("live");
        for await (const message of sseMessages(response.body, signal)) {
          if (!this.live(generation)) return;
          if (message.retry !== undefined) retryMs = message.retry;
          // Where this stream began reading, before its history: resuming from there misses nothing, also of a
          // named channel the cursor we sent did not cover (it started at the present).
          if (message.start) this.cursor = message.start;
          if (message.data === undefined) continue;
          // Every event comes with an `id:` line (its cursor), whatever its name; the service's own notices
          // (`session_ended`, `unsubscribed`) come without one. Told apart by that, never by the name.
          if (message.hasId) this.deliver(JSON.parse(message.data), message.id);
          else if (message.event === "session_ended") ended = true;
          else if (message.event === "unsubscribed") this.revoked(JSON.parse(message.data));
        }
      } catch {
        if (!this.live(generation)) return;
      }
      if (!this.live(generation)) return;
      this.setState("reconnecting");
      if (ended) {
        // The token expired or the session ended: the next request refreshes, or finds it gone.
        continue;
      }
      if (Date.now() - opened >= HEALTHY_STREAM_MS) this.attempts = 0;
      await sleep(Math.max(retryMs ?? 0, this.backoff()));
    }
  }

  /** @private */
  openWebSocket(generation) {
    const address = this.client.url(`/ws${this.query()}`);
    address.protocol = address.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(address);
    this.socket = socket;
    socket.onmessage = (message) => {
      const frame = JSON.parse(message.data);
      const { type, cursor, ...event } = frame;
      if (type === "welcome") {
        this.attempts = 0;
        // Its `start` is where this connection began reading, before the history it is about to send: resuming
        // from there misses nothing, also of a named channel the cursor we sent did not cover (it started at the
        // present). Its `cursor` stands after that history: taken only when there is none yet.
        if (frame.start) this.cursor = frame.start;
        else this.cursor ??= cursor;
        this.welcomed = true;
        this.accepted();
        this.setState("live");
      } else if (type === "event") {
        this.deliver(event, cursor); // whatever the event's name: frames are told apart by their type
      } else if (type === "unsubscribed" && frame.reason) {
        this.revoked(frame);
      } else if (type !== "pong") {
        this.answered(frame);
      }
    };
    socket.onclose = (close) => {
      if (!this.live(generation)) return;
      this.socketGone();
      this.setState("reconnecting");
      // 1008: the token expired or the session ended; 1006: the handshake may have been refused (401).
      this.recover(generation, close.code === 1008 ? 0 : this.backoff());
    };
  }

  /**
   * Opens the WebSocket after checking what its handshake would be refused for: with a plain request,
   * a refusal has a status and a reason (a refused handshake is just a close).
   * @private
   */
  reopenWebSocket(generation) {
    if (this.named.size || this.pending.length) this.recover(generation, 0);
    else this.openWebSocket(generation);
  }

  /**
   * After a WebSocket closed: check the session (refreshing if need be) and the channels, then reopen,
   * or stop.
   * @private
   */
  async recover(generation, delay) {
    if (delay) await sleep(delay);
    if (!this.live(generation)) return;
    let response;
    try {
      // Without a cursor, a poll reads nothing: it only says whether these channels may be read.
      const check = this.named.size ? `/events${this.query({}, { cursor: false })}` : "/auth/me";
      response = await this.client.request(check);
      if (this.live(generation) && CHANNEL_REFUSALS.has(response.status) && this.named.size) {
        if (await this.refused(response)) return this.recover(generation, 0);
      }
    } catch {
      return this.recover(generation, this.backoff()); // offline: try again later
    }
    if (!this.live(generation)) return;
    if (response.status === 401) return this.sessionGone(generation);
    if (response.ok) this.openWebSocket(generation);
    else this.recover(generation, this.backoff());
  }

  /** @private */
  async longPoll(generation) {
    await this.pollLoop(generation, "/events/wait", { timeout: LONG_POLL_SECONDS }, LONG_POLL_PAUSE_MS);
  }

  /** @private */
  async poll(generation) {
    await this.pollLoop(generation, "/events", {}, POLL_INTERVAL_MS);
  }

  /** @private */
  async pollLoop(generation, path, params, pauseMs) {
    // The first request is a plain poll, answered at once: it shows the connection works (a held long
    // poll says nothing until it answers) and brings what is already waiting.
    let target = "/events";
    while (this.live(generation)) {
      this.abort = new AbortController();
      const { signal } = this.abort;
      let response;
      try {
        const url = target === path ? `${path}${this.query(params)}` : `${target}${this.query()}`;
        target = path;
        response = await this.client.request(url, { signal });
        if (this.live(generation) && CHANNEL_REFUSALS.has(response.status) && this.named.size) {
          if (await this.refused(response, signal)) {
            target = "/events";
            continue; // at once, with the channels that remain
          }
        }
      } catch {
        if (!this.live(generation)) return;
        this.setState("reconnecting");
        await sleep(this.backoff());
        continue;
      }
      if (!this.live(generation)) return;
      if (response.status === 401) return this.sessionGone(generation);
      if (response.status === 200) {
        this.attempts = 0;
        this.accepted();
        this.setState("live");
        const body = await response.json();
        if (!this.live(generation)) return;
        for (const event of body.events) this.deliver(event);
        this.cursor = body.cursor;
        continue; // more may be waiting
      }
      if (response.status === 204) {
        this.attempts = 0;
        this.accepted();
        this.setState("live");
        this.cursor = response.headers.get("Event-Cursor") || this.cursor;
        await sleep(pauseMs);
      } else {
        this.setState("reconnecting");
        await sleep(this.backoff());
      }
    }
  }
}

/**
 * The messages of a text/event-stream body, parsed as the HTML standard's EventSource does.
 * @param {ReadableStream<Uint8Array>} body
 * @param {AbortSignal} [signal]
 * @returns {AsyncGenerator<{event: string, data?: string, id?: string, hasId: boolean, retry?: number, start?: string}>}
 *   `data` is absent on a message that only sets `retry`; `start` is from the service's opening comment
 *   (`: stream open, start <cursor>`: where the stream began reading); `id` is the last event ID (kept from
 *   earlier messages, as EventSource keeps it), `hasId` whether this message had an `id:` line of its own
 */
export async function* sseMessages(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const abort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", abort);
  let buffer = "";
  let event = "";
  let data = [];
  let id;
  let hasId = false;
  let retry;
  let start;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      // A "\r" at the end may be the first half of "\r\n": keep it until the next chunk.
      const lines = buffer.split(/\r\n|\r(?!$)|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (data.length || retry !== undefined || start !== undefined) {
            const message = { event: event || "message", data: data.length ? data.join("\n") : undefined, id, hasId };
            yield { ...message, retry, start };
          }
          event = "";
          data = [];
          hasId = false;
          retry = undefined;
          start = undefined;
          continue;
        }
        const opened = /^: stream open, start (\S+)$/.exec(line); // the opening's comment: where it began reading
        if (opened) start = opened[1];
        if (line.startsWith(":")) continue; // a comment: the heartbeat
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "event") event = text;
        else if (field === "data") data.push(text);
        else if (field === "id" && !text.includes("\0")) {
          id = text;
          hasId = true;
        }
        else if (field === "retry" && /^\d+$/.test(text)) retry = Number(text);
      }
    }
  } finally {
    signal?.removeEventListener("abort", abort);
    reader.cancel().catch(() => {}); // also when the caller stopped early: close the connection
  }
}
