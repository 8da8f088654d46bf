"""Sluice SDK for Python gateways.

The same contracts as the Go SDK (module github.com/sluicehq/sluice):

- ``sluice_metering.event``: usage event v1 and its validation;
- ``sluice_metering.emitter``: Emitter and AsyncEmitter, usage events to ingest in
  the background (batched, bounded, retried with back-off and jitter);
- ``sluice_metering.checker``: the flag Checker (docs/flags.md) and the refusals it
  answers with;
- ``sluice_metering.admission``: Limiter and AsyncLimiter over the shared Lua
  scripts of sdk/go/admission (docs/admission.md);
- ``sluice_metering.policy``: the policy file's admission rules, the Go policy
  package's AdmissionRules (docs/python-sdk.md);
- ``sluice_metering.usage``: what a provider's answer says it used (OpenAI,
  Azure, Anthropic, Gemini), read as the Go SDK's providerusage reads it;
- ``sluice_metering.litellm``: a LiteLLM proxy hook built on the above
  (docs/litellm.md).
"""

from .admission import AsyncLimiter, Decision, Limiter, Request, Rule, Rules, Scope, TenantRules, Ticket
from .checker import Checker, FlagDecision, Refusal, refusal
from .emitter import AsyncEmitter, BufferFull, Closed, Emitter, HTTPSender
from .event import UsageEvent, ValidationError, new_id

__all__ = [
    "AsyncEmitter", "AsyncLimiter", "BufferFull", "Checker", "Closed", "Decision", "Emitter", "FlagDecision",
    "HTTPSender", "Limiter", "Refusal", "Request", "Rule", "Rules", "Scope", "TenantRules", "Ticket", "UsageEvent",
    "ValidationError", "new_id", "refusal",
]
