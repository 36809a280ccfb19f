"""Consul connection settings: the one typed place every hvd-elastic command reads them from.

They follow the Consul ecosystem exactly: the same
``CONSUL_HTTP_*`` variables the ``consul`` CLI and Consul's Go API read, with
an explicit value (a command-line flag) winning over the environment.

Token precedence, highest first: explicit token, explicit token file,
``CONSUL_HTTP_TOKEN``, ``CONSUL_HTTP_TOKEN_FILE``.  The token never appears in
``repr()`` or logs.  A token read from a file remembers the file, so a
long-running command (node agent, host-cache watcher) follows a rotated token
(:meth:`ConsulConfig.with_fresh_token`) and a child can be given the path
instead of the secret.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

# The environment's value rules are the whole project's (re-exported: Consul's settings raise them too).
from hvd_elastic.envvars import ConfigError, env_bool, parse_bool  # noqa: F401

TYPE_CHECKING = False  # typing and ssl cost start-up time on discovery's path (run every second)
if TYPE_CHECKING:
    import ssl

DEFAULT_CONSUL_ADDR = "127.0.0.1:8500"

#: Each setting's (flag, variable), for errors that name what actually set a bad value.
SETTINGS = {
    "addr": ("--http-addr", "CONSUL_HTTP_ADDR"),
    "ca_file": ("--ca-file", "CONSUL_CACERT"),
    "ca_path": (None, "CONSUL_CAPATH"),
    "client_cert": ("--client-cert", "CONSUL_CLIENT_CERT"),
    "client_key": ("--client-key", "CONSUL_CLIENT_KEY"),
}


@dataclasses.dataclass(frozen=True)
class ConsulConfig:
    """Where and how to reach a Consul agent's HTTP API."""

    host: str = "127.0.0.1"
    port: int = 8500
    scheme: str = "http"
    token: str | None = dataclasses.field(default=None, repr=False)
    verify: bool = True
    ca_file: str | None = None
    ca_path: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    tls_server_name: str | None = None
    datacenter: str | None = None
    token_file: str | None = dataclasses.field(default=None, repr=False)  # absolute; where ``token`` came from
    # The settings (keys of SETTINGS) given as flags; the others came from their variables.
    from_flags: frozenset[str] = dataclasses.field(default=frozenset(), repr=False, compare=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    def setting(self, key: str) -> str:
        """The flag or variable that set ``key`` (a key of SETTINGS), for an error message."""
        flag, variable = SETTINGS[key]
        return flag if flag and key in self.from_flags else variable

    def __repr__(self) -> str:  # never show the token
        shown = "set" if self.token else "none"
        return f"ConsulConfig({self.base_url}, token={shown}, verify={self.verify})"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        addr: str | None = None,
        token: str | None = None,
        token_file: str | None = None,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        datacenter: str | None = None,
        addr_flag: str = "--http-addr",
    ) -> ConsulConfig:
        """Build the configuration from ``CONSUL_HTTP_*`` variables and explicit overrides (``addr_flag``: the
        flag that gave ``addr``, for errors)."""
        env = os.environ if environ is None else environ
        raw_addr = addr or env.get("CONSUL_HTTP_ADDR") or DEFAULT_CONSUL_ADDR
        scheme, host, port = _parse_addr(raw_addr, addr_flag if addr else "CONSUL_HTTP_ADDR")
        if not addr or "://" not in raw_addr:
            if env_bool("CONSUL_HTTP_SSL", False, env):
                scheme = "https"
        verify = env_bool("CONSUL_HTTP_SSL_VERIFY", True, env)

        resolved_token, source_file = _resolve_token(env, token, token_file)
        cfg = cls(
            host=host,
            port=port,
            scheme=scheme,
            token=resolved_token,
            verify=verify,
            ca_file=ca_file or env.get("CONSUL_CACERT") or None,
            ca_path=env.get("CONSUL_CAPATH") or None,
            client_cert=client_cert or env.get("CONSUL_CLIENT_CERT") or None,
            client_key=client_key or env.get("CONSUL_CLIENT_KEY") or None,
            tls_server_name=env.get("CONSUL_TLS_SERVER_NAME") or None,
            datacenter=datacenter,
            token_file=source_file,
            from_flags=frozenset(key for key, value in (("addr", addr), ("ca_file", ca_file),
                                                        ("client_cert", client_cert), ("client_key", client_key))
                                 if value),
        )
        if bool(cfg.client_cert) != bool(cfg.client_key):
            given, missing = ("client_cert", "client_key") if cfg.client_cert else ("client_key", "client_cert")
            raise ConfigError(f"{cfg.setting(given)} is set without {cfg.setting(missing)}: a client certificate "
                              "needs its key (set both, or neither)")
        return cfg

    def with_fresh_token(self) -> ConsulConfig:
        """This configuration with the token read again from its file (itself when the token came from no file).

        Token files are rotated in place by tools such as Vault Agent; a
        command that runs for days must not keep an expired token.  Raises
        ConfigError when the file can no longer be read.
        """
        if not self.token_file:
            return self
        token = read_token_file("token file", self.token_file, warn=False) or None
        return self if token == self.token else dataclasses.replace(self, token=token)

    def ssl_context(self) -> ssl.SSLContext | None:
        """An SSL context for https, honouring CA, client certificate and verify settings.

        Raises ConfigError when the CA or client certificate files cannot be loaded.
        """
        if self.scheme != "https":
            return None
        import ssl  # only here: plain-http discovery never pays for importing it

        for key in ("ca_file", "client_cert", "client_key"):  # the commonest mistake, named precisely
            _check_readable(self.setting(key), getattr(self, key))
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file, capath=self.ca_path)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            where = (f"{self.setting('ca_file')}={self.ca_file!r}" if self.ca_file
                     else f"CONSUL_CAPATH={self.ca_path!r}")
            raise ConfigError(f"{where} holds no usable CA certificate: {_tls_reason(exc)}") from None
        if self.client_cert:
            try:
                ctx.load_cert_chain(self.client_cert, self.client_key)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{self.setting('client_cert')}={self.client_cert!r} and "
                                  f"{self.setting('client_key')}={self.client_key!r} are no certificate and "
                                  f"matching key in PEM: {_tls_reason(exc)}") from None
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _check_readable(name: str, path: str | None) -> None:
    """ConfigError naming ``name`` and ``path`` when ``path`` (if set) cannot be opened."""
    if not path:
        return
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{name}={path!r} cannot be read: {exc.strerror or exc}") from None


def _tls_reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)


def _parse_addr(raw: str, name: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an agent address; ``name`` (the flag or variable that gave it) in errors."""
    text = raw.strip()
    scheme = "http"
    expected = "(expected host:port or http[s]://host:port)"
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https"):
            raise ConfigError(f"{name}={raw!r}: scheme {parts.scheme!r} is not supported (expected http or https)")
        scheme = parts.scheme
        host = parts.hostname
        # The port as written: urlsplit's .port raises a bare ValueError for 'abc' or 99999.
        after_host = parts.netloc.rpartition("@")[2].rpartition("]")[2]
        port_text = after_host.partition(":")[2]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
        host = host.strip("[]")
    if not host:
        raise ConfigError(f"{name}={raw!r} has no host {expected}")
    if port_text and not port_text.isdigit():
        raise ConfigError(f"{name}={raw!r}: port {port_text!r} is not a number {expected}")
    port = int(port_text) if port_text else (443 if scheme == "https" else 8500)
    if not 0 < port < 65536:
        raise ConfigError(f"{name}={raw!r}: port {port} is out of range (expected 1-65535)")
    return scheme, host, port


def token_file_exposure(path: str) -> str | None:
    """Why users other than the owner may get at the token file ``path`` (ssh's rule for private keys), or None."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return None  # reading it reports the error
    if mode & 0o077:
        import shlex  # only on this rare path

        return f"is open to other users (mode {mode:04o}): run chmod 600 {shlex.quote(path)}"
    return None


def read_token_file(source: str, path: str, *, warn: bool = True) -> str:
    """The token in ``path``, whitespace stripped (empty when the file is); ``source`` names the setting in errors.

    Raises ConfigError when the file cannot be read; with ``warn``, logs a
    warning when other users may read it.
    """
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise ConfigError(f"{source}={path!r} cannot be read: {exc.strerror}") from None
    exposed = token_file_exposure(path) if warn else None
    if exposed:  # a warning, not a refusal: a group-shared token file may be a site's deliberate choice
        import logging  # only here: discovery's path stays light

        logging.getLogger("hvd_elastic.consul.config").warning("%s=%r %s", source, path, exposed)
    return token


def _resolve_token(env: Mapping[str, str], token: str | None, token_file: str | None) -> tuple[str | None, str | None]:
    """(token, the absolute path of the file it came from or None)."""
    if token:
        return token, None
    if token_file:
        return read_token_file("--token-file", token_file) or None, os.path.abspath(token_file)
    if env.get("CONSUL_HTTP_TOKEN"):
        return env["CONSUL_HTTP_TOKEN"], None
    if env.get("CONSUL_HTTP_TOKEN_FILE"):
        path = env["CONSUL_HTTP_TOKEN_FILE"]
        return read_token_file("CONSUL_HTTP_TOKEN_FILE", path) or None, os.path.abspath(path)
    return None, None
