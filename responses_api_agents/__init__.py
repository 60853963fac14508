"""One directory per server. Other search roots' copies of this package are searched first (see nemo_gym.server_paths)."""

from nemo_gym.server_paths import extend_package_path

__path__ = extend_package_path(__path__, __name__)
