"""The leanest event stream in Python on gevent: two forked processes accept from one listening socket with
gevent's own StreamServer, read a request's head with one receive, answer with a fixed head and one line, and
hold the connection until the client leaves. No HTTP parsing, no WSGI, no gunicorn: what accepting, a greenlet,
a receive and a send cost, the floor under any server written this way.

Run: python -m bench.peers.lean_stream PORT [WORKERS]
"""

import os
import signal
import sys

import gevent
from gevent.server import StreamServer

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"X-Accel-Buffering: no\r\n\r\n: stream open\n\n"
)


def serve(sock, _address) -> None:
    if not sock.recv(65536):
        return
    sock.sendall(ANSWER)
    while sock.recv(65536):
        pass


def main() -> None:
    port, workers = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
    server = StreamServer(("127.0.0.1", port), serve, backlog=4096)
    server.init_socket()
    children = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            gevent.reinit()
            server.serve_forever()
            os._exit(0)
        children.append(pid)

    def stop(_signum, _frame):
        for child in children:
            os.kill(child, signal.SIGKILL)
        sys.exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, stop)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
