"""Run with Home Assistant's own Python (in the root's venv, by
`Tests/HomeAssistant/run --lock`): prints the Python requirements of what
the tier makes Home Assistant load, one a line, so that they are installed
up front and a run never installs anything.

That is: the integrations Home Assistant always sets up (its bootstrap's
core, logging, HTTP and default sets), the entity components whose modules
its service descriptions import, MQTT, and the four the onboarding's
core-configuration step starts a flow for, each with every integration it
depends on or sets up after (their requirements are processed too) and the
entity integrations its platforms set up (google_translate's tts.py sets
up tts, which wants mutagen); and the authentication modules' own
requirements (TOTP)."""

import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path

import homeassistant
import homeassistant.auth.mfa_modules
import homeassistant.auth.providers
import homeassistant.bootstrap as bootstrap

COMPONENTS = Path(homeassistant.__file__).parent / "components"
# onboarding/views.py, CoreConfigOnboardingView: `onboard_integrations`.
ONBOARDING = re.search(r"onboard_integrations = \[([^\]]*)\]",
                       (COMPONENTS / "onboarding/views.py").read_text())
if ONBOARDING is None:
    sys.exit("integrations.py: onboarding/views.py no longer lists onboard_integrations")

# helpers/service.py, _base_components: the entity components whose modules
# the service descriptions import (the frontend asks for them at once).
BASE_COMPONENTS = re.search(r"def _base_components.*?from homeassistant\.components import \(([^)]*)\)",
                            (COMPONENTS.parent / "helpers/service.py").read_text(), re.S)
if BASE_COMPONENTS is None:
    sys.exit("integrations.py: helpers/service.py no longer has _base_components")

roots = (set(re.findall(r"[a-z_]+", re.sub(r"#.*", "", BASE_COMPONENTS.group(1)))) | set(bootstrap.CORE_INTEGRATIONS) | set(bootstrap.LOGGING_AND_HTTP_DEPS_INTEGRATIONS)
         | set(bootstrap.FRONTEND_INTEGRATIONS) | set(bootstrap.DEFAULT_INTEGRATIONS)
         | {"mqtt"} | set(re.findall(r'"([a-z_]+)"', ONBOARDING.group(1))))


def manifest(domain: str) -> dict:
    return json.loads((COMPONENTS / domain / "manifest.json").read_text())


ENTITY_DOMAINS = {path.parent.name for path in COMPONENTS.glob("*/manifest.json")
                  if manifest(path.parent.name).get("integration_type") == "entity"}
seen: set = set()
todo = sorted(roots)
requirements: dict = {}
while todo:
    domain = todo.pop()
    if domain in seen:
        continue
    seen.add(domain)
    wants = manifest(domain)
    for requirement in wants.get("requirements", []):
        requirements.setdefault(requirement, domain)
    todo += wants.get("dependencies", []) + wants.get("after_dependencies", [])
    todo += [path.stem for path in (COMPONENTS / domain).glob("*.py") if path.stem in ENTITY_DOMAINS]
for package in (homeassistant.auth.mfa_modules, homeassistant.auth.providers):
    for module in pkgutil.iter_modules(package.__path__):
        for requirement in getattr(importlib.import_module(f"{package.__name__}.{module.name}"), "REQUIREMENTS", []):
            requirements.setdefault(requirement, f"auth {module.name}")
for requirement, domain in sorted(requirements.items()):
    print(f"{requirement}  # {domain}")
