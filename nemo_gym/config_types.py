"""The config models of a server instance, under upstream NeMo Gym's names.

``BaseServerConfig`` -> ``BaseRunServerConfig`` -> ``BaseRunServerInstanceConfig`` is the chain every
server's own config class extends. The catalog keys (``domain``, ``datasets``, ``description`` ...)
are accepted, kept (the head endpoint shows them) and checked for shape; nothing here acts on them.
``domain`` is optional here: upstream refuses a resources server without one.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_gym.config.keys import ConfigKeys
from nemo_gym.durable.lease import OWNER_LEASE_SECONDS
from nemo_gym.durable.store import STORE_TIMEOUT_SECONDS
from nemo_gym.env import DEFAULT_HOST
from nemo_gym.protocols.input_limits import (
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_HEADER_TIMEOUT_SECONDS,
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MIN_BODY_BYTES_PER_SECOND,
)
from nemo_gym.routing.replica import replica_urls
from nemo_gym.sessions.secret import check_length


class Domain(str, Enum):
    MATH = "math"
    CODING = "coding"
    AGENT = "agent"
    KNOWLEDGE = "knowledge"
    INSTRUCTION_FOLLOWING = "instruction_following"
    LONG_CONTEXT = "long_context"
    SAFETY = "safety"
    GAMES = "games"
    TRANSLATION = "translation"
    E2E = "e2e"
    RLHF = "rlhf"
    OTHER = "other"


class DatasetSource(BaseModel):
    """Where a dataset is downloaded from; the fields past ``type`` belong to that host."""

    model_config = ConfigDict(extra="allow")

    type: Literal["gitlab", "huggingface"]


class DatasetConfig(ConfigKeys):
    """One entry of an instance's ``datasets`` list."""

    name: str
    type: Literal["train", "validation", "example", "benchmark"]
    jsonl_fpath: str
    num_repeats: int = Field(default=1, ge=1)
    license: str | None = None
    source: DatasetSource | None = None
    gitlab_identifier: Any = None
    huggingface_identifier: Any = None
    prepare_script: str | None = None
    prompt_config: str | None = None

    @model_validator(mode="after")
    def licensed_for_training(self) -> "DatasetConfig":
        if self.type in ("train", "validation") and self.license is None:
            raise ValueError(f"dataset {self.name!r} of type {self.type} needs a license")
        return self


class CatalogSettings(BaseModel):
    domain: Domain | None = None
    verified: bool = False
    verified_url: str | None = None
    description: str | None = None
    value: str | None = None
    datasets: list[DatasetConfig] | None = None  # upstream's optional list: null is no datasets


class BaseServerConfig(ConfigKeys):
    """Where a server listens. Subclasses add their settings; an unknown key loads with a warning, a near
    miss of a declared one (a typo) is a config error naming it (nemo_gym/config/keys.py)."""

    host: str = DEFAULT_HOST
    port: int
    num_workers: int = 1


class BaseRunServerConfig(BaseServerConfig, CatalogSettings):
    entrypoint: str = "app.py"
    # Unset, it is left out of dumps: upstream servers redact every *secret* key of a dumped config to "***"
    # and validate the dump again (anyterminal_agent's _safe_config_json), which a "***" secret would fail.
    session_secret: str | None = Field(default=None, exclude_if=lambda secret: secret is None)
    # Larger request bodies get 413 before they are read.
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    # A larger request head gets 431; a head slower than this, or a body slower than this rate over
    # such a window, gets 408 (nemo_gym/protocols/input_limits.py, docs/input-limits.md).
    max_header_bytes: int = Field(default=DEFAULT_MAX_HEADER_BYTES, gt=0)
    header_timeout_seconds: float = Field(default=DEFAULT_HEADER_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False)
    body_timeout_seconds: float = Field(default=DEFAULT_BODY_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False)
    min_body_bytes_per_second: float = Field(default=DEFAULT_MIN_BODY_BYTES_PER_SECOND, ge=0, allow_inf_nan=False)
    # Off switch for session routing (on by default for resources servers and agents).
    route_sessions: bool = True
    # Balanced placement (off by default): a new session starts on the worker that has started fewest,
    # not where its first request lands; costs a hop on the later requests of a client that keeps its
    # connection to the worker it first reached (docs/routing.md "Balanced placement").
    place_sessions: bool = False
    # Off switch for hand-off (on by default): a request for another worker's session, on a plain connection
    # of the public port with nothing of it under way here, hands the connection itself to that worker of this
    # host, which replies straight to the client (docs/routing.md "Hand-off"); off, such requests are forwarded.
    # In a replica set it also switches the relay of other replicas' sessions' requests as bytes (docs/replicas.md).
    hand_off: bool = True
    # Off switch for durable sessions (on for routed servers whose class declares ``session_states``).
    durable_sessions: bool = True
    # Session lifecycle (docs/lifecycle.md): a session with no request for this long ends (its state,
    # its durable row and its resources go, through on_session_end); 0 or null: never idle (it then ends after
    # the cookie's max age, 14 days, without a request).
    session_idle_timeout_seconds: float | None = Field(default=3600.0, ge=0, allow_inf_nan=False)
    # At most this many live sessions on the instance's workers of one host (null: no cap); a new session
    # over it gets 503 with Retry-After, before anything of it is allocated.
    max_sessions: int | None = Field(default=None, gt=0)
    # Where durable sessions are stored: a file path (SQLite), or unset: the instance's SQLite file under
    # the state directory (nemo_gym/durable/store.py, docs/durable-sessions.md).
    session_store: str | None = None
    # With a store shared across hosts (postgresql://...): how long a worker's owner lease lasts; renewed
    # every third of it. A session whose owner's lease has expired may be adopted by any replica
    # (nemo_gym/durable/lease.py, docs/durable-sessions.md).
    owner_lease_seconds: float = Field(default=OWNER_LEASE_SECONDS, gt=0, allow_inf_nan=False)
    # The deadline of each operation on a store reached over a network (postgresql://...): a store that has
    # not answered by then counts as down for it (a write gets 503 with Retry-After): docs/durable-sessions.md.
    store_timeout_seconds: float = Field(default=STORE_TIMEOUT_SECONDS, gt=0, allow_inf_nan=False)
    # A replica set (docs/replicas.md): a routed server with a configured session_secret is a replica;
    # the others reach it at advertise_host (default: host; required when host is a wildcard such as
    # 0.0.0.0) on its forwarding port (default: a free one, chosen at start and named in each session).
    advertise_host: str | None = None
    forward_port: int | None = Field(default=None, ge=0, lt=65536)
    # A replica that has answered no connection for this long counts as dead: its sessions get 410.
    peer_dead_after_seconds: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    # Mutual TLS between the replicas: this replica's certificate and key, and the CA that signs every replica's.
    replica_tls_certfile: str | None = None
    replica_tls_keyfile: str | None = None
    replica_tls_ca_file: str | None = None
    # The root URLs (http or https, no path) of this instance's replicas on other hosts, for clients: Gym's
    # client spreads new sessions over the instance's URL and these (docs/replicas.md).
    replicas: list[str] = []
    # On a Ray cluster (``ray_head_node_address``), ``gym env start`` runs this many replicas, one per node,
    # as one replica set, and lists them in ``replicas`` (docs/ray.md).
    num_replicas: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def replica_tls_whole(self) -> "BaseRunServerConfig":
        tls = {"replica_tls_certfile": self.replica_tls_certfile, "replica_tls_keyfile": self.replica_tls_keyfile, "replica_tls_ca_file": self.replica_tls_ca_file}
        if any(tls.values()) and not all(tls.values()):
            missing = ", ".join(key for key, value in tls.items() if not value)
            raise ValueError(f"TLS between replicas needs all three of {', '.join(tls)}; missing: {missing}")
        return self

    @field_validator("replicas")
    @classmethod
    def replicas_are_root_urls(cls, replicas: list[str]) -> list[str]:
        return replica_urls(replicas)

    @field_validator("session_secret")
    @classmethod
    def secret_long_enough(cls, secret: str | None) -> str | None:
        return secret if secret is None else check_length(secret, "session_secret")


class BaseRunServerInstanceConfig(BaseRunServerConfig):
    # The instance name (the config's top-level key), filled in by the framework.
    name: str


class ModelServerRef(ConfigKeys):
    type: Literal["responses_api_models"]
    name: str


class ResourcesServerRef(ConfigKeys):
    type: Literal["resources_servers"]
    name: str


class AgentServerRef(ConfigKeys):
    type: Literal["responses_api_agents"]
    name: str


class AggregateMetricsRequest(BaseModel):
    verify_responses: list[dict[str, Any]]


class AggregateMetrics(BaseModel):
    """Upstream's three parts, plus this project's plain summary of the rewards."""

    group_level_metrics: list[dict[str, Any]] = []
    agent_metrics: dict[str, Any] = {}
    key_metrics: dict[str, Any] = {}
    num_episodes: int = 0
    mean_reward: float = 0.0
    reward_counts: dict[str, int] = {}


ROLLOUT_PATH_PREFIX = "ng-rollout"
TOKEN_CAPTURE_PATH_SEGMENT = "training-token-capture"


def __getattr__(name: str) -> Any:
    """``OmegaConf``, which upstream's config_types has among its names (imported only when asked for)."""
    if name == "OmegaConf":
        from omegaconf import OmegaConf

        return OmegaConf
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
