"""What the worker (gevent_worker.py) remembers instead of working out for every request: gunicorn's settings,
the Date header of the current second, and whether a peer may send forwarding headers. Each gives the answer
gunicorn's own code gives."""

from __future__ import annotations

import email.utils
import time

import gunicorn.http.message
import gunicorn.util
from gunicorn.config import Config

from gevent_worker import SettledConfig, http_date_of_this_second, remembered_allow_list_check


def test_settings_are_read_once_and_a_setting_changed_is_read_again():
    cfg = Config()
    settled = SettledConfig(cfg)
    assert settled.graceful_timeout == cfg.graceful_timeout == 30
    assert "graceful_timeout" in settled.__dict__  # remembered: the next read does not ask gunicorn
    settled.set("graceful_timeout", 5)  # what a reloading worker does (gunicorn.conf.py)
    assert settled.graceful_timeout == cfg.graceful_timeout == 5
    assert settled.forwarded_allow_networks() == cfg.forwarded_allow_networks()  # methods too
    assert settled.settings is cfg.settings


def test_the_date_header_is_the_current_seconds():
    calls = []

    def counting(timestamp=None):
        calls.append(timestamp)
        return gunicorn.util.http_date(timestamp)

    cached = http_date_of_this_second(counting)
    first, second = cached(), cached()
    assert first == second and len(calls) == 1
    assert abs(email.utils.parsedate_to_datetime(first).timestamp() - time.time()) < 2
    assert cached(0) == "Thu, 01 Jan 1970 00:00:00 GMT"  # a given time is formatted, never remembered


def test_a_peers_trust_is_gunicorns_answer_remembered_per_address():
    check = gunicorn.http.message._ip_in_allow_list
    remembered = remembered_allow_list_check(check, limit=3)
    cfg = Config()
    cfg.set("forwarded_allow_ips", "127.0.0.1,10.0.0.0/8")
    networks, allowed = cfg.forwarded_allow_networks(), cfg.forwarded_allow_ips
    for ip in ("127.0.0.1", "10.1.2.3", "192.0.2.1", "not an address", "127.0.0.1", "10.1.2.3", "::1"):
        assert remembered(ip, allowed, networks) == check(ip, allowed, networks), ip
    assert remembered("192.0.2.1", ["*"], []) is True  # the list is part of what is remembered
