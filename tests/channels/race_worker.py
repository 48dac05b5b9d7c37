"""A gunicorn worker for tests of changes of access that land while a subscription is being opened.

It is the project's worker, whose app does what a test asked right after a subscription's access check has
answered: after the check and before the subscription is in force, the moment a real race hits too rarely to
test. A test asks by storing a list of actions under `test:race:<user id>` (RACE_KEY); the next access check of
that user's subscription (`?channels=` of any transport, a WebSocket subscribe frame) takes the list and does
each action the way the service does it: `{"revoke": channel}` (the API's revocation, announced),
`{"publish": channel}` (an event from the server), `{"demote": true}` (the role set to user, as the API sets it).

A revocation's message travels on the channel's own wake-up channel: a test makes sure the worker does not read
it then (nobody hears the message). A demotion's goes on the control channel, which the worker always reads: the
action waits until the worker's hub has handled it (before the new connection is there to hear it).

Chosen with GUNICORN_CMD_ARGS="--worker-class tests.channels.race_worker.RaceWorker" (RACE_WORKER); the arbiter
imports this module, so the app is imported only in the worker, after gevent's patching, as it always is.
"""

from __future__ import annotations

import json

import gevent.event

from gevent_worker import FairGeventWorker

RACE_KEY = "test:race:{}"
RACE_WORKER = {"GUNICORN_CMD_ARGS": "--worker-class tests.channels.race_worker.RaceWorker"}
RACE_EVENT = "in-window"  # the name of the events a `publish` action publishes


class RaceWorker(FairGeventWorker):
    """The project's gevent worker; its app's access checks run the actions a test stored (see the module)."""

    def load_wsgi(self):
        super().load_wsgi()
        install()


def install() -> None:
    """Wrap the access check where the transports call it (views for `?channels=`, ws for subscribe frames)."""
    from app.events import views, ws
    from wsgi import app

    checked, hub = views.check_subscribe, app.extensions["event_hub"]
    handle_control = hub._control
    heard: dict[str, gevent.event.Event] = {}  # user id -> set once the hub handled a control message about it

    def control_then_tell(message: dict) -> None:
        handle_control(message)
        if message.get("user_id") in heard:
            heard.pop(message["user_id"]).set()

    hub._control = control_then_tell

    def check_then_race(client, user_id: str, is_admin: bool, channels: list[str], proxy=None, namespaces_read=None):
        access = checked(client, user_id, is_admin, channels, proxy, namespaces_read)
        asked = client.getdel(RACE_KEY.format(user_id))
        if asked:
            with app.app_context():
                for action in json.loads(asked):
                    act(app, user_id, action, heard)
        return access

    views.check_subscribe = ws.check_subscribe = check_then_race


def act(app, user_id: str, action: dict, heard: dict) -> None:
    """One action, done as the service does it."""
    from app.auth.users import set_role
    from app.channels.manage import revoke_member

    if "revoke" in action:
        revoke_member(action["revoke"], user_id)
    elif "publish" in action:
        app.extensions["event_bus"].publish(action["publish"], RACE_EVENT, {"said": "while the reader was opening"})
    elif action.get("demote"):
        handled = heard[user_id] = gevent.event.Event()
        assert set_role(user_id, "user") is not None
        assert handled.wait(10), "the hub never handled the role change's message"
