// Swagger UI over this service's own document. An external script: the page's CSP allows no inline one.
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  deepLinking: true,
  validatorUrl: null,
});
