"""Upstream's ``ecs_fargate.engine`` config types: an ECS Fargate task per sandbox and its optional SSH sidecar (data only here)."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_EXEC_SERVER_PORT = 19542
DEFAULT_SSM_PROJECT = "harbor"
DEFAULT_SSHD_PORT = 52222


@dataclass(frozen=True)
class SshSidecarConfig:
    """With ``exec_server_port`` the sidecar tunnels one way to an exec server; without it, both ways to an agent server."""

    sshd_port: int = 2222
    ssh_ready_timeout_sec: float = 300.0
    public_key_secret_arn: str = ""
    private_key_secret_arn: str = ""
    image: str | None = None
    exec_server_port: int | None = None


@dataclass(frozen=True)
class EcsFargateConfig:
    region: str | None = None
    cluster: str = ""
    subnets: list[str] = field(default_factory=list)
    security_groups: list[str] = field(default_factory=list)
    assign_public_ip: bool = False
    task_definition: str | None = None
    task_definition_family_prefix: str = "ecs-sandbox"
    image_template: str | None = None
    container_name: str = "main"
    container_port: int | None = None
    cpu: str = "4096"
    memory: str = "8192"
    ephemeral_storage_gib: int | None = None
    platform_version: str | None = None
    execution_role_arn: str | None = None
    task_role_arn: str | None = None
    extra_env: dict[str, str] | None = None
    log_group: str | None = None
    log_stream_prefix: str | None = None
    max_task_lifetime_sec: int = 14400
    startup_timeout_sec: float = 300.0
    poll_interval_sec: float = 2.0
    run_task_max_retries: int = 30
    ssh_sidecar: SshSidecarConfig | None = None
    s3_bucket: str | None = None
    s3_prefix: str | None = None
    ecr_repository: str | None = None
    environment_dir: str | None = None
    codebuild_project: str | None = None
    codebuild_service_role: str | None = None
    codebuild_compute_type: str = "BUILD_GENERAL1_MEDIUM"
    codebuild_build_timeout: int = 60
    dockerhub_secret_arn: str | None = None
    build_parallelism: int = 50
    # Copy a missing image into ECR when a sandbox is created (False: fail on a miss).
    auto_mirror: bool = True
    efs_filesystem_id: str | None = None
    efs_access_point_id: str | None = None
    ssm_project: str = DEFAULT_SSM_PROJECT
