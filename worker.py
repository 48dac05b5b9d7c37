"""The delivery process: `python worker.py` (the Procfile's `worker:` line). It sends outgoing webhooks and the
OpenID provider's back-channel logouts.

gevent patches the standard library first, so every attempt's socket and DNS lookup yields instead of
blocking. Logging is gunicorn.conf.py's (one JSON object per line, LOG_LEVEL), so both processes' lines
read alike. Then the app is built exactly as for the web process (wsgi.py: the same settings, with the
developer's .env and `make run`'s $DATA_DIR/.env beneath the environment, the same metrics directory).
"""

from gevent import monkey

monkey.patch_all()

import logging.config  # noqa: E402 - everything after patching
import runpy  # noqa: E402
from pathlib import Path  # noqa: E402

# gunicorn.conf.py's logging; reading it applies the .env files first (envfiles.py), so a LOG_LEVEL set
# there counts here too.
logging.config.dictConfig(runpy.run_path(str(Path(__file__).with_name("gunicorn.conf.py")))["logconfig_dict"])
import wsgi  # noqa: E402 - the environment complete, the app built
from app.metrics import serve_worker_metrics  # noqa: E402
from app.outgoing.delivery import DeliveryWorker  # noqa: E402

if __name__ == "__main__":
    serve_worker_metrics(wsgi.app)  # its own /metrics when WORKER_METRICS_PORT is set (a dyno of its own)
    DeliveryWorker(wsgi.app).run()
