"""Who may use a cluster's streams: its CURVE keys, and whether an address stays on this machine.

Streams bound to loopback need no keys (a run on one host binds Unix sockets in a private directory instead, which
other users cannot reach: `ZmqTransport`'s ``ipc_dir``); beyond loopback, every stream is encrypted with CURVE and
only clients holding the cluster's client key may connect (`ZmqTransport` refuses to bind there without keys).

The keys' directory is private: `CurveKeys.create` writes every key file with mode 0600 in a directory of mode
0700, and `CurveKeys.load` refuses a directory or secret key that other users may read or write (whoever reads a
secret key can join the cluster; whoever writes the directory can authorize a key of their own), naming the file
and the ``chmod`` that fixes it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import zmq

from streams.private_files import check_private, make_private_dir, write_private

KEY_NAMES = ("server", "client")


@dataclass(frozen=True)
class CurveKeys:
    """A cluster's CURVE keys (Z85): one pair for the binding side (receivers, publishers), one for the
    connecting side (senders, subscribers). Only clients whose public key is in ``authorized_dir`` may connect.

    Make them once with `CurveKeys.create(directory)` and give every machine of the cluster a copy.
    """

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized_dir: str

    @classmethod
    def create(cls, directory: str) -> CurveKeys:
        """New key pairs in ``directory`` (made with mode 0700 if missing; an existing one must be private)."""
        make_private_dir(directory)
        for name in KEY_NAMES:
            public, secret = zmq.curve_keypair()
            write_private(directory, f"{name}.key", _key_file(public))
            write_private(directory, f"{name}.key_secret", _key_file(public, secret))
        return cls.load(directory)

    @classmethod
    def load(cls, directory: str) -> CurveKeys:
        """The keys in ``directory``; PermissionError if it, or a secret key in it, is open to other users."""
        import zmq.auth

        check_private(directory)
        secrets = [os.path.join(directory, f"{name}.key_secret") for name in KEY_NAMES]
        for path in secrets:
            check_private(path)
        server, client = (zmq.auth.load_certificate(path) for path in secrets)
        return cls(*server, *client, authorized_dir=directory)

    def secure(self, socket: zmq.Socket, server: bool) -> None:
        """Make ``socket`` a CURVE server (the binding side) or client (the connecting side) with these keys.
        A server admits only the clients its context's authenticator allows."""
        if server:
            socket.curve_server = True
            socket.curve_publickey, socket.curve_secretkey = self.server_public, self.server_secret
        else:
            socket.curve_serverkey = self.server_public
            socket.curve_publickey, socket.curve_secretkey = self.client_public, self.client_secret


def _key_file(public: bytes, secret: bytes | None = None) -> str:
    """A key in ZeroMQ's certificate format (what ``zmq.auth.load_certificate`` reads)."""
    lines = ["#   ZeroMQ CURVE certificate (tidal): keep it private, mode 0600", "metadata", "curve",
             f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name or a wildcard: not loopback
        return False
