// A real OpenID provider for the OAuth client tests: node-oidc-provider with its development
// login and consent screens, one confidential client that must use PKCE, and a count of token
// requests at /__counts so tests can prove that a refused callback never reached the provider.
//
// Environment: PORT, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI; and, for a product's single-page app, a
// second client when SPA_CLIENT_ID is set: public (no secret, PKCE), redirecting to SPA_REDIRECT_URI, its
// token endpoint open to that page's origin by CORS (the provider's rule for public clients).
// Accounts: any login name works. "someone@example.com" has a verified e-mail; a name of the form
// "unverified.someone@example.com" has the e-mail "someone@example.com", not verified.
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const counts = { token: 0, authorization: 0 };

const clients = [{
  client_id: process.env.CLIENT_ID,
  client_secret: process.env.CLIENT_SECRET,
  redirect_uris: [process.env.REDIRECT_URI],
  grant_types: ['authorization_code'],
  response_types: ['code'],
}];
if (process.env.SPA_CLIENT_ID) {
  clients.push({
    client_id: process.env.SPA_CLIENT_ID,
    token_endpoint_auth_method: 'none',
    redirect_uris: [process.env.SPA_REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  });
}

const provider = new Provider(issuer, {
  clients,
  pkce: { required: () => true },
  claims: { openid: ['sub'], email: ['email', 'email_verified'] },
  cookies: { keys: ['test-only-cookie-signing-key'] },
  features: { devInteractions: { enabled: true } },
  async findAccount(ctx, id) {
    const unverified = id.startsWith('unverified.');
    const email = unverified ? id.slice('unverified.'.length) : id;
    return { accountId: id, async claims() { return { sub: id, email, email_verified: !unverified }; } };
  },
});

provider.use(async (ctx, next) => {
  if (ctx.path === '/__counts') {
    ctx.body = counts;
    return;
  }
  if (ctx.path === '/token' && ctx.method === 'POST') counts.token += 1;
  if (ctx.path === '/auth') counts.authorization += 1;
  await next();
});

provider.on('server_error', (ctx, error) => console.error('server_error', error));
provider.listen(port, '127.0.0.1', () => console.log(`openid provider listening at ${issuer}`));
