"""CURVE security: key files, and making a ZeroMQ socket a CURVE server or client.

Anyone who can reach a server's port could otherwise join a job, read every table and add to it.
With security on, every server socket is a CURVE server that accepts only clients whose public keys
are listed (ZAP authentication, answered on a thread of the server's own: ``Authenticator``), and
every client socket (the communication thread's, the workers' read sockets, status queries, moves)
is a CURVE client that knows the server's public key: traffic is encrypted and authenticated both
ways, and ZeroMQ hands nothing from an unauthenticated peer to the application.

This module is the one place that loads key files and sets CURVE options; callers hold a
``Security`` (None when off) built from the config. Keys are ZeroMQ certificate files (the format of
``zmq.auth``), made by ``bosen keys DIR`` (``make_keys``). docs/design.md, "CURVE security".
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from bosen.config import Config
from bosen.errors import BosenError, ConfigError

log = logging.getLogger("bosen.security")

SECRET_SUFFIX = "_secret"  # ZeroMQ's naming: NAME.key (public) beside NAME.key_secret (both keys)
KEY_CHARS = 40  # a 32-byte key in Z85
# the socket monitor events that say a connection's security handshake failed
HANDSHAKE_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL \
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
LOOPBACK_NAMES = ("localhost",)


class KeyFileError(BosenError):
    """A key file that cannot be used (missing, malformed, the wrong kind)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (of HOST:PORT) is this machine only. Names other than localhost count as
    reachable from elsewhere: without a DNS lookup we cannot know, and erring towards keys is safe."""
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def required(config: Config) -> bool:
    """Whether the job runs with CURVE: ``security.mode`` on, or auto and a server not on loopback."""
    mode = config.security.mode
    if mode != "auto":
        return mode == "on"
    return not all(is_loopback(addr.rpartition(":")[0]) for addr in config.cluster.servers)


def describe(config: Config) -> str:
    """One line for the start of a job: what protects its connections."""
    if required(config):
        return "security: CURVE (encrypted, clients authenticated by public key)"
    if config.security.mode == "off" and not all(is_loopback(a.rpartition(":")[0]) for a in config.cluster.servers):
        return "security: OFF on a non-loopback address (security.mode: off): anyone who reaches a port joins"
    return "security: off (loopback only)"


# -- key files -------------------------------------------------------------------------------------------


def _z85_key(raw: bytes, path: Path, what: str) -> bytes:
    if len(raw) != KEY_CHARS:
        raise KeyFileError(f"{path}: {what} is not a {KEY_CHARS}-character Z85 key (got {len(raw)} characters)")
    try:
        z85.decode(raw)
    except Exception:
        raise KeyFileError(f"{path}: {what} is not valid Z85") from None
    return raw


def load_key_file(path: str | os.PathLike[str], secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret) Z85 keys from a ZeroMQ certificate file; ``secret``: the file must hold the
    secret key too, and it must belong to the public one. Raises KeyFileError naming the file."""
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as e:
        raise KeyFileError(f"{p}: cannot read key file: {e.strerror}") from None
    public = secret_key = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(b"#") or b"=" not in line:
            continue
        name, _, value = line.partition(b"=")
        name, value = name.strip(), value.strip(b" \t'\"")
        if name == b"public-key":
            public = _z85_key(value, p, "public-key")
        elif name == b"secret-key":
            secret_key = _z85_key(value, p, "secret-key")
    if public is None:
        raise KeyFileError(f"{p}: not a ZeroMQ certificate (no public-key line); make keys with `bosen keys DIR`")
    if secret:
        if secret_key is None:
            raise KeyFileError(f"{p}: holds no secret-key (a public key file; the secret one is "
                               f"{p.name}{SECRET_SUFFIX})")
        if zmq.curve_public(secret_key) != public:
            raise KeyFileError(f"{p}: its secret-key does not belong to its public-key")
    return public, secret_key


def _secret_path(path: str) -> str:
    return path if path.endswith(SECRET_SUFFIX) else path + SECRET_SUFFIX


def load_allowed(paths: Iterable[str]) -> frozenset[bytes]:
    """The public keys in ``paths``: certificate files, or folders whose ``*.key`` files are read."""
    keys = set()
    for path in paths:
        p = Path(path)
        files = sorted(p.glob("*.key")) if p.is_dir() else [p]
        if p.is_dir() and not files:
            raise KeyFileError(f"{p}: no *.key files (client public keys) in this folder")
        for f in files:
            keys.add(load_key_file(f, secret=False)[0])
    return frozenset(keys)


def _write_key_file(path: Path, public: bytes, secret: bytes | None) -> None:
    """A ZeroMQ certificate (the format ``zmq.auth.load_certificate`` reads); a secret one mode 0600
    from its creation (never readable by others, not even briefly)."""
    kind = "secret" if secret else "public"
    lines = [f"#   ****  Generated by bosen keys: ZeroMQ CURVE {kind} certificate  ****",
             "#   ZeroMQ CURVE " + ("**Secret** Certificate: DO NOT PROVIDE THIS FILE TO OTHER USERS"
                                   if secret else "Public Certificate: exchange securely, or sign"),
             "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")


def make_keys(folder: str | os.PathLike[str], clients: int = 1) -> list[Path]:
    """``bosen keys DIR``: one server key pair (every server of a job may share it) and ``clients``
    client key pairs: DIR/server.key(+_secret), DIR/clients/client-I.key (the public keys servers
    accept) and DIR/client-I.key_secret. Existing files are never overwritten. Returns the files."""
    if clients < 1:
        raise BosenError(f"--clients: must be >= 1, got {clients}")
    root = Path(folder)
    (root / "clients").mkdir(parents=True, exist_ok=True)
    made = [root / "server.key", *(root / "clients" / f"client-{i}.key" for i in range(clients))]
    for p in made:
        for f in (p, root / (p.name + SECRET_SUFFIX)):
            if f.exists():
                raise BosenError(f"{f}: exists; keys are never overwritten (choose another folder)")
    out = []
    for p in made:
        public, secret = zmq.curve_keypair()
        _write_key_file(p, public, None)
        _write_key_file(root / (p.name + SECRET_SUFFIX), public, secret)
        out += [p, root / (p.name + SECRET_SUFFIX)]
    return out


def job_keys(config: Config, folder: Path) -> Config:
    """``config``, with keys made for this job alone in ``folder`` when it needs CURVE and names no key
    at all: a launcher that starts every process itself (``bosen launch --ray``, whose servers listen
    on their nodes' addresses) can hand each the keys through the run directory, mode 0600, which
    nobody else on the network holds. A config that names some keys keeps them (``Security.load``
    then says what is missing)."""
    sec = config.security
    if not required(config) or sec.server_key or sec.client_key or sec.allowed_clients:
        return config
    if not (folder / "server.key").exists():
        make_keys(folder, clients=1)
    made = dataclasses.replace(sec, server_key=str(folder / "server.key"),
                               client_key=str(folder / f"client-0.key{SECRET_SUFFIX}"),
                               allowed_clients=(str(folder / "clients"),))
    log.info("security: CURVE with keys made for this job in %s", folder)
    return dataclasses.replace(config, security=made)


# -- sockets ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Security:
    """The keys one process needs: a server's (its key pair, the clients it accepts) or a client's
    (its key pair, the servers' public key). Built by ``for_server``/``for_client``; None = off."""

    server_public: bytes
    server_secret: bytes | None = None  # servers only
    client_public: bytes | None = None  # clients only
    client_secret: bytes | None = None
    allowed: frozenset[bytes] = frozenset()  # servers only

    @classmethod
    def load(cls, config: Config, role: Literal["server", "client"]) -> Security | None:
        """Keys for ``role`` when the job runs with CURVE (``required``), else None. A key the job
        needs and does not name, or a file that cannot be used, is a ConfigError naming the key and
        the config file."""
        if not required(config):
            return None
        sec = config.security
        where = f"{config.source}: security"
        why = f"mode {sec.mode}" + ("" if sec.mode == "on" else f", servers {', '.join(config.cluster.servers)}"
                                    " not on loopback")
        names = ("server_key", "allowed_clients") if role == "server" else ("server_key", "client_key")
        for name in names:
            if not getattr(sec, name):
                raise ConfigError(f"{where}.{name}: required, the job runs with CURVE security ({why}); "
                                  "make keys with `bosen keys DIR`")
        try:
            if role == "server":
                public, secret = load_key_file(_secret_path(sec.server_key), secret=True)
                return cls(public, secret, allowed=load_allowed(sec.allowed_clients))
            server_public, _ = load_key_file(sec.server_key, secret=False)
            client_public, client_secret = load_key_file(sec.client_key, secret=True)
            return cls(server_public, client_public=client_public, client_secret=client_secret)
        except KeyFileError as e:
            raise ConfigError(f"{where}: {e}") from None

    def serve(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server (before it binds); the context's ``Authenticator`` decides who
        gets in."""
        assert self.server_secret is not None, "a client's keys cannot serve"
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.server_secret)

    def connect(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of the job's servers (before it connects)."""
        assert self.client_secret is not None and self.client_public is not None, "a server's keys cannot connect"
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.client_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.client_secret)


def client_socket(ctx: zmq.Context, kind: int, security: Security | None) -> zmq.Socket:
    """A new socket of ``kind``, a CURVE client when ``security`` is on."""
    sock = ctx.socket(kind)
    if security is not None:
        security.connect(sock)
    return sock


def handshake_error(event: int, value: int, address: str, closed_is_refusal: bool = True) -> str | None:
    """What a client-side monitor event says went wrong with the connection to ``address``, or None
    for events that are not a failed security handshake. A handshake the server closed without a
    word (``NO_DETAIL``) is a refusal unless ``closed_is_refusal`` is off: while a lost server is
    being replaced, that is the server going away mid-handshake, which recovery handles."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"server at {address} refused this client's public key (ZAP status {value}): it is not in the "
                "server's security.allowed_clients")
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return (f"server at {address} speaks another security mechanism: one side runs with CURVE and the other "
                    "without (check security.mode and the addresses on both)")
        return f"security handshake with server at {address} failed: protocol error {value:#x}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and closed_is_refusal:
        return (f"security handshake with server at {address} failed: the server closed it (security.server_key is "
                "not that server's public key, or one side runs without CURVE: check security.mode on both)")
    return None


class Authenticator:
    """ZAP for one server's context: admits the allowed public keys, logs each refused key once
    (a refused client retries; the log would otherwise fill) and counts refusals. It answers on a
    thread of its own (pyzmq's ``ThreadAuthenticator``), so a handshake is not queued behind the
    server's event loop while that applies a large update."""

    def __init__(self, ctx: zmq.Context, allowed: frozenset[bytes], where: str) -> None:
        self.allowed = allowed
        self.where = where
        self.refused = 0  # handshakes refused (read by STATUS)
        self._logged: set[bytes] = set()
        self._lock = threading.Lock()
        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger("bosen.security.zap"))
        self._auth.start()
        self._auth.configure_curve_callback("*", self)

    def reload(self, allowed: frozenset[bytes]) -> None:
        """Admit ``allowed`` from the next handshake on (``bosen-server`` on SIGHUP: clients added or
        revoked without a restart). Connections already made stay: CURVE authenticates a
        connection once, at its handshake."""
        with self._lock:
            self.allowed = allowed
            self._logged.clear()  # a key refused again after a reload is logged again

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider hook: ``key`` is the client's public key in Z85."""
        if key in self.allowed:
            return True
        with self._lock:
            self.refused += 1
            first = key not in self._logged
            self._logged.add(key)
        if first:
            log.warning("%s: refused a client whose public key %s is not allowed (security.allowed_clients); "
                        "further attempts with this key are not logged", self.where, key.decode(errors="replace"))
        return False

    def stop(self) -> None:
        self._auth.stop()


def server_socket(ctx: zmq.Context, kind: int, security: Security | None, where: str) -> tuple[zmq.Socket,
                                                                                                Authenticator | None]:
    """A new socket of ``kind`` that serves CURVE clients when ``security`` is on, with the
    authenticator of its context (stop it after closing the socket, before ``ctx.term()``)."""
    auth = Authenticator(ctx, security.allowed, where) if security is not None else None
    sock = ctx.socket(kind)
    if security is not None:
        security.serve(sock)
    return sock, auth


def public_key_of(path: str | os.PathLike[str]) -> str:
    """The Z85 public key in a certificate file (for messages and ``bosen keys``)."""
    return load_key_file(path, secret=False)[0].decode()


__all__ = ["Security", "Authenticator", "KeyFileError", "required", "describe", "is_loopback", "load_key_file",
           "load_allowed", "make_keys", "job_keys", "client_socket", "server_socket", "handshake_error",
           "public_key_of", "HANDSHAKE_FAILED", "Refused", "watch", "unwatch", "poll"]


class Refused(BosenError):
    """A server refused this client's connection in the security handshake."""


def watch(sock: zmq.Socket) -> zmq.Socket:
    """A monitor socket that hears of ``sock``'s failed security handshakes (call before connect);
    ZeroMQ otherwise answers a refused client with silence."""
    return sock.get_monitor_socket(HANDSHAKE_FAILED)


def unwatch(sock: zmq.Socket, monitor: zmq.Socket) -> None:
    sock.disable_monitor()
    monitor.close(0)


def poll(sock: zmq.Socket, monitor: zmq.Socket, address: str, timeout_ms: int) -> bool:
    """``sock.poll(timeout_ms)`` for a blocking request: True when a message waits, False after the
    timeout; raises Refused, naming the server at ``address``, as soon as its handshake fails."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        ready = dict(poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
        if sock in ready:
            return True
        if monitor in ready:
            ev = parse_monitor_message(monitor.recv_multipart())
            reason = handshake_error(ev["event"], ev["value"], address)
            if reason is not None:
                raise Refused(reason)
        if time.monotonic() >= deadline:
            return False
