"""The configuration as the values a reply is made with: the sampling and the longest reply
(``generation_settings``) and what it says of the draft length (``policy_setting``)."""

from __future__ import annotations

from chatapp.engine.loop import GenerationSettings
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.draft_length import PolicySetting
from chatapp.settings.config import Config


def generation_settings(config: Config) -> GenerationSettings:
    sampling = SamplingParams(config.temperature, config.top_k, config.top_p, config.min_p)
    return GenerationSettings(sampling=sampling, max_tokens=config.max_tokens)


def policy_setting(config: Config) -> PolicySetting:
    """What ``config`` says of the draft length, with the setup its measurements are kept for."""
    return PolicySetting(config.fixed_draft_length, tuple(config.measured_setup()))
