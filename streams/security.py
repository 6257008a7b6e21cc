"""Who may use a cluster's streams: its CURVE keys, and whether an address stays on this machine.

Streams bound to loopback need no keys; beyond loopback, every stream is encrypted with CURVE and only clients
holding the cluster's client key may connect (`ZmqTransport` refuses to bind there without keys).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass

import zmq


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
        import zmq.auth

        os.makedirs(directory, exist_ok=True)
        for name in ("server", "client"):
            zmq.auth.create_certificates(directory, name)
        return cls.load(directory)

    @classmethod
    def load(cls, directory: str) -> CurveKeys:
        import zmq.auth

        server = zmq.auth.load_certificate(os.path.join(directory, "server.key_secret"))
        client = zmq.auth.load_certificate(os.path.join(directory, "client.key_secret"))
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


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name or a wildcard: not loopback
        return False
