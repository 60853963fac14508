"""One directory per server. Other search roots' copies of this package are searched first (see nemo_gym.config.paths)."""

from nemo_gym.config.paths import extend_package_path

__path__ = extend_package_path(__path__, __name__)
