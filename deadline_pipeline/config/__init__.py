"""The user's configuration: one YAML file validated with pydantic.

The file is ``deadlines.yaml`` in the working directory, or ``--config FILE`` / ``$DEADLINE_CONFIG``.
Relative paths inside it (source locations, ``subscribers_csv``) are read relative to the file's own
folder; ``${DEADLINE_HOME}`` and other environment variables are expanded in paths.

Every problem is reported as :class:`ConfigError` naming the file, the key path and what was
expected, never as a traceback from inside pydantic or YAML.

The package, by idea (this module re-exports the public names, so ``from deadline_pipeline.config
import X`` is the one way in):

* :mod:`~deadline_pipeline.config.sections`: the pydantic models of the file's sections, and
  :mod:`~deadline_pipeline.config.channels` those of its channel types (both on
  :mod:`~deadline_pipeline.config.base`'s ``Section``);
* :mod:`~deadline_pipeline.config.quantities`: the numbers as constrained types (unit and range);
* :mod:`~deadline_pipeline.config.text`: checks of text values (one line, zones, quiet hours);
* :mod:`~deadline_pipeline.config.agreement`: settings that must agree with each other;
* :mod:`~deadline_pipeline.config.loading`: :func:`load_config`, with file, line and key in errors;
* :mod:`~deadline_pipeline.config.document` and :mod:`~deadline_pipeline.config.encoding`: the YAML
  and its bytes;
* :mod:`~deadline_pipeline.config.subscribers_csv`: the subscriber file;
* :mod:`~deadline_pipeline.config.environment`: variables and relative paths;
* :mod:`~deadline_pipeline.config.messages`: the wording of pydantic's errors, did-you-mean;
* :mod:`~deadline_pipeline.config.errors`: :class:`ConfigError`.
"""

from deadline_pipeline.config.agreement import channel_send_window
from deadline_pipeline.config.channels import (
    AppriseChannel,
    CaldavChannel,
    ChannelConfig,
    MaildirChannel,
    SlackChannel,
    SmtpChannel,
    WebhookChannel,
)
from deadline_pipeline.config.errors import ConfigError
from deadline_pipeline.config.loading import DEFAULT_CONFIG_NAME, load_config, tenant_problems
from deadline_pipeline.config.messages import did_you_mean
from deadline_pipeline.config.sections import (
    SOURCE_FORMATS,
    BusinessDaysConfig,
    DeadlinesConfig,
    DeliveryConfig,
    EscalationConfig,
    NetworkConfig,
    PlanConfig,
    SourceConfig,
    SubscriberConfig,
    SubscriptionConfig,
    WatchConfig,
    asset_name,
)
from deadline_pipeline.config.text import parse_quiet_hours
from deadline_pipeline.durations import parse_duration

# Raised and caught under this name since the configuration was one module; tracebacks and any
# code that names the class by its module keep reading deadline_pipeline.config.ConfigError.
ConfigError.__module__ = __name__

__all__ = [
    "DEFAULT_CONFIG_NAME", "SOURCE_FORMATS", "AppriseChannel", "BusinessDaysConfig", "CaldavChannel",
    "ChannelConfig", "ConfigError", "DeadlinesConfig", "DeliveryConfig", "EscalationConfig", "MaildirChannel",
    "NetworkConfig", "PlanConfig", "SlackChannel", "SmtpChannel", "SourceConfig", "SubscriberConfig",
    "SubscriptionConfig", "WatchConfig", "WebhookChannel", "asset_name", "channel_send_window", "did_you_mean",
    "load_config", "parse_duration",
    "parse_quiet_hours", "tenant_problems",
]
