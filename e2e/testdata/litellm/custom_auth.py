"""The test's LiteLLM keys: each key belongs to a team, and the team is the
Sluice tenant (what virtual keys in LiteLLM's database give; the test runs
the proxy without a database, so this custom auth stands in for it)."""

from fastapi import Request
from litellm.proxy._types import UserAPIKeyAuth

TEAMS = {"sk-ll-acme": "ll-acme", "sk-ll-capped": "ll-capped", "sk-ll-flagged": "ll-flagged", "sk-ll-bench": "ll-bench"}


async def user_api_key_auth(request: Request, api_key: str) -> UserAPIKeyAuth:
    team = TEAMS.get(api_key.removeprefix("Bearer ").strip())
    if team is None:
        raise Exception("unknown key")
    return UserAPIKeyAuth(api_key=api_key, team_id=team, key_alias=team + "-key")
