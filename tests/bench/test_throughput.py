"""bench.throughput's CURVE analysis: the bounds it derives from thread CPU per MiB, and the cost of
libsodium's cipher in the library libzmq loaded (a libzmq built without libsodium would fall back to
TweetNaCl, many times slower: this test would then say so)."""

from __future__ import annotations

import zmq

from bench.throughput import __main__ as throughput


def test_bounds_are_plaintext_over_curve_cpu_in_total_and_for_the_busiest_thread():
    plain = {"thread_cpu_us": {"client": {"io": 100.0, "comm": 200.0}, "server": {"loop": 100.0}}}
    curve = {"thread_cpu_us": {"client": {"io": 800.0, "comm": 100.0}, "server": {"loop": 100.0}}}
    assert throughput.cpu_bounds(plain, curve) == {"cpu": 0.4, "stage": 0.25}
    assert throughput.cpu_bounds({"thread_cpu_us": {}}, curve) is None  # no /proc: nothing to say


def test_the_cipher_is_libsodiums_and_its_cost_per_MiB_is_measured():
    assert zmq.has("curve")
    cost = throughput.cipher_us_per_MiB(reps=3)
    assert cost is not None, "libzmq loaded no libsodium: CURVE runs on TweetNaCl"
    assert "libsodium" in cost["library"]
    assert cost["encrypt_us"] > 0 and cost["decrypt_us"] > 0
    assert cost["encrypt_min_max"][0] <= cost["encrypt_us"] <= cost["encrypt_min_max"][1]
