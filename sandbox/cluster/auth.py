"""Whether a Ray cluster enforces token authentication, asked before connecting to it.

Ray's own security page: anybody who can reach a cluster's ports (GCS, dashboard, Jobs API,
client server) can run arbitrary code on it; its token authentication (``RAY_AUTH_MODE=token``,
Ray >= 2.52) is off unless a node is started with it. The sandbox nodes of this project hold
task images, checkpoints and a Podman service, so the Ray backend connects only to a cluster
whose GCS refuses a caller without the token, unless the run allows an unauthenticated one
(``allow_unauthenticated``: a loopback-only test cluster), which the run's config records
(design page, "Scale-out").

The check is one gRPC call to the GCS (``NodeInfoGcsService.GetClusterId``) on a bare channel
that carries no token: ``UNAUTHENTICATED`` means token mode, an answer means none. A second
call with this process's own token (when it has one) tells a wrong token from a right one, so
a client that lacks or holds the wrong token is refused at once, naming the fix, instead of
``ray.init`` retrying for a minute and saying "Failed to connect".
"""

from __future__ import annotations

import os

TOKEN = "token"
DISABLED = "disabled"

AUTH_FIX = ("make a token with `ray get-auth-token --generate` (it writes ~/.ray/auth_token), "
            "copy that file to every node, and start every node (`ray start`) and the trainer "
            "with RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=<the token file>; docs/scale-out.md")
"""The fix named by every refusal: the env variables and the command that makes a token."""


class ClusterAuthError(RuntimeError):
    """The cluster does not enforce token authentication (and the run does not allow that),
    or this process lacks the cluster's token; ``str()`` is one line naming the fix."""


def gcs_auth_mode(gcs_address: str, token: str | None = None, timeout_s: float = 5.0) -> str:
    """The answer of the GCS at ``gcs_address`` (``HOST:PORT``) to a call carrying ``token``
    (None: no token).

    Returns: :data:`TOKEN` when it refuses the call as unauthenticated, :data:`DISABLED` when
    it answers. Raises: ConnectionError (one line) when it does neither within ``timeout_s``
    seconds.
    """
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(gcs_address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s,
                              metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return TOKEN
            raise ConnectionError(f"the GCS at {gcs_address} did not answer "
                                  f"({exc.code().name}: {exc.details()})") from None
    return DISABLED


def own_token(address: str) -> str | None:
    """This process's Ray token as Ray reads it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``,
    ``~/.ray/auth_token``), or None when ``ray.init(address)`` would send none:
    ``RAY_AUTH_MODE`` is not ``token`` (unset with ``address="auto"``: Ray then uses a token
    it finds, as ``ray.init`` does for a cluster it finds itself), or no token is found."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if not (mode is not None and mode.lower() == TOKEN or mode is None and address == "auto"):
        return None
    from ray._raylet import AuthenticationTokenLoader

    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    return loader.get_raw_token(ignore_auth_mode=True)


def gcs_address_of(address: str) -> str | None:
    """``HOST:PORT`` of the GCS that ``ray.init(address)`` would join (``auto``: the cluster
    this machine belongs to, as Ray finds it), or None when ``auto`` finds none (then
    ``ray.init`` refuses on its own) or the address is a Ray client one (``ray://``)."""
    if address.startswith("ray://"):
        return None
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address)
    except (ConnectionError, ValueError):
        return None


def require_token_auth(address: str, gcs_address: str, allow_unauthenticated: bool) -> str:
    """The cluster's authentication mode, when this process may use it.

    Args:
        address: the ``ray_address`` as the user gave it (named in the message).
        gcs_address: ``HOST:PORT`` of its GCS.
        allow_unauthenticated: a cluster without token authentication is accepted.

    Returns: :data:`TOKEN` or :data:`DISABLED` (only when allowed).
    Raises: ClusterAuthError, one line naming ``ray_address`` and :data:`AUTH_FIX`: the
    cluster does not enforce tokens and that is not allowed; it does and this process has no
    token (``RAY_AUTH_MODE``/``RAY_AUTH_TOKEN_PATH`` unset) or a token it refuses.
    ConnectionError when the GCS does not answer.
    """
    mode = gcs_auth_mode(gcs_address)
    if mode == DISABLED:
        if allow_unauthenticated:
            return mode
        raise ClusterAuthError(
            f"ray_address={address!r}: the Ray cluster does not enforce token authentication, "
            "so anyone who reaches its ports can run code on its nodes; refused (to allow it "
            "on a loopback-only test cluster: --sandbox-allow-unauthenticated); " + AUTH_FIX)
    token = own_token(address)
    if token is None:
        raise ClusterAuthError(
            f"ray_address={address!r}: the Ray cluster requires its token and this process "
            "has none (RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH unset or the file missing); "
            + AUTH_FIX)
    if gcs_auth_mode(gcs_address, token) == TOKEN:
        raise ClusterAuthError(
            f"ray_address={address!r}: the Ray cluster refuses this process's token (not the "
            "one the cluster was started with); " + AUTH_FIX)
    return mode
