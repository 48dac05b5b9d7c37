"""flask-sse as its README sets it up (a peer for the benchmarks, not part of the service).

Run: gunicorn bench.peers.flask_sse_app:app --worker-class gevent
"""

import os

from flask import Flask, request
from flask_sse import sse

app = Flask(__name__)
app.config["REDIS_URL"] = os.environ["REDIS_URL"]
app.register_blueprint(sse, url_prefix="/stream")


@app.post("/publish")
def publish():
    sse.publish(request.get_data(as_text=True), type="bench")
    return "", 204


@app.get("/healthz")
def healthz():
    return "ok"
