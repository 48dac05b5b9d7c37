// The logout question (app/templates/logout.html). The answer's POST names this browser's session by its access
// cookie, which may have expired while the refresh cookie (sent to /auth only) still holds: client.js renews it
// first (only when needed, under the lock its other tabs use), so that "Log out" ends the session this browser
// really has. Without this script the form still works while the access cookie lives.
import { Client } from "./client.js";

const form = document.getElementById("logout-form");
let renewed = false;
form?.addEventListener("submit", async (event) => {
  const button = event.submitter;
  if (renewed || !button || button.value !== "logout") return;
  event.preventDefault();
  try {
    await new Client().me();
  } catch {
    // The service could not say: the answer tells what it could do.
  }
  renewed = true;
  form.requestSubmit(button);
});
