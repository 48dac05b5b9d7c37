"""A bare WSGI app: what a request costs on this project's gunicorn with nothing of the service in it."""


def app(environ, start_response):
    environ["wsgi.input"].read()
    body = b'{"id":"1-0","channel":"rooms:r1"}'
    start_response("201 CREATED", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
