"""The one rule for what in a vllm_server_models entry is a secret, how the host's
last-good record keeps it (its digest, never its value) and how a rollback gets the value
back from the inventory. Used by upgrade.build_record and upgrade.rollback_vars;
unit-tested in tests/unit/test_record_secrets.py. No Ansible imports.

What is redacted in each entry (redact_models):
- every value of `env` (any variable may carry a secret: HF_TOKEN, a proxy URL with a
  password...), the keys kept;
- in `extra_args`, the value of every option whose name says it holds a secret
  (secret_name: one of SECRET_WORDS is a word of the name: --api-key, --hf-token,
  --client-secret, --db-password, --aws-credentials), in both forms: `--opt=value`, and
  `--opt value` (every argument after the option up to the next one that starts with
  "-", as argparse reads them: a flag without a value, such as
  --return-tokens-as-token-ids followed by another option, has nothing redacted);
- any other key of the entry whose name says it holds a secret (e.g. `hf_token:`), the
  whole value.

A redacted value is kept as "sha256:<hex>", the SHA-256 of the value's text (a string as
it is, anything else as JSON), unkeyed and unsalted. Why a plain digest is enough here:
the secrets that land in these places are machine-made tokens (a Hugging Face token is
"hf_" and 34 random letters and digits, about 200 bits; API keys are as long), whose
digest cannot be turned back into the token. It is not enough for a guessable value (a
short password, a word): its digest can be tried against a list of guesses, so such a
value does not belong in a model entry (docs/upgrades.md says so). A keyed digest would
need a key the control node (where the rollback compares digests) and the record share:
a new secret to keep and rotate. A random salt per write would make every write differ
(vllm_record would report a change on every run) unless it were kept and reused. The
record is also mode 0600, readable by root only, who can read the running containers'
environment anyway; the digest protects the copies (the module's output, backups).
"""
from __future__ import annotations

import hashlib
import json
import re

__all__ = ["SECRET_WORDS", "digest", "redact_args", "redact_models", "restore_models",
           "secret_name"]

# A name holds a secret when one of its words (split at "-", "_", "." and case, leading
# dashes dropped) is one of these. Whole words, so --max-num-batched-tokens, --tokenizer
# and --ssl-keyfile (a path) are not secrets, while --api-key, --hf-token and HF_TOKEN are.
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "secrets", "password",
                          "passwords", "passwd", "passphrase", "credential", "credentials"})
_WORD_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")


def secret_name(name):
    """True when `name` (an option such as --hf-token, an env or entry key such as
    hf_token) says its value is a secret (SECRET_WORDS)."""
    words = _WORD_SPLIT.split(str(name).lstrip("-"))
    return any(word.lower() in SECRET_WORDS for word in words if word)


def digest(value):
    """"sha256:<hex>" of a value's text: a number, bool, null, list or mapping as sorted
    JSON, anything else (a string, a vaulted string) as str() has it."""
    if value is None or isinstance(value, (bool, int, float, list, tuple, dict)):
        text = json.dumps(value, sort_keys=True, default=str)
    else:
        text = str(value)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _slots(args):
    """The secret options of an argument list: [(start, end, option, values, joined)],
    args[start:end] being the option and its values; joined for --opt=value."""
    slots, i = [], 0
    while i < len(args):
        arg = str(args[i])
        name, eq, value = arg.partition("=")
        if arg.startswith("-") and secret_name(name):
            if eq:
                slots.append((i, i + 1, name, [value], True))
            else:
                end = i + 1
                while end < len(args) and not str(args[end]).startswith("-"):
                    end += 1
                if end > i + 1:  # a flag without a value holds nothing
                    slots.append((i, end, name, list(args[i + 1:end]), False))
                    i = end
                    continue
        i += 1
    return slots


def _tokens(name, values, joined):
    return [f"{name}={values[0]}"] if joined else [name] + list(values)


def redact_args(args):
    """An argument list with each secret option's values replaced by their digests."""
    out, last = [], 0
    for start, end, name, values, joined in _slots(args):
        out += list(args[last:start]) + _tokens(name, [digest(str(v)) for v in values], joined)
        last = end
    return out + list(args[last:])


def _redact_entry(entry):
    out = {}
    for key, value in entry.items():
        if key == "env" and isinstance(value, dict):
            out[key] = {k: digest(v) for k, v in value.items()}
        elif key == "extra_args" and isinstance(value, (list, tuple)):
            out[key] = redact_args(value)
        elif (key in ("env", "extra_args") and value) or secret_name(key):
            out[key] = digest(value)  # a shape the roles refuse: kept as a whole
        else:
            out[key] = value
    return out


def redact_models(models):
    """vllm_server_models as the last-good record keeps them: no secret (module doc)."""
    return [_redact_entry(e) if isinstance(e, dict) else e for e in models or []]


def _redacted_parts(entry):
    """What redact_models replaced in a recorded entry: (env keys, [(option, occurrence)],
    whole keys)."""
    env = entry.get("env")
    env_keys = list(env) if isinstance(env, dict) else []
    args = entry.get("extra_args")
    options = []
    if isinstance(args, (list, tuple)):
        seen = {}
        for slot in _slots(args):
            seen[slot[2]] = seen.get(slot[2], -1) + 1
            options.append((slot[2], seen[slot[2]]))
    whole = [k for k, v in entry.items()
             if (k in ("env", "extra_args") and v and not isinstance(
                 v, dict if k == "env" else (list, tuple))) or
             (k not in ("env", "extra_args") and secret_name(k))]
    return env_keys, options, whole


def _restore_args(recorded, current, name, notes):
    rec_slots = _slots(recorded)
    cur = {}
    if isinstance(current, (list, tuple)):
        for slot in _slots(current):
            cur.setdefault(slot[2], []).append(slot)
    out, last, seen = [], 0, {}
    for start, end, option, digests, joined in rec_slots:
        seen[option] = seen.get(option, -1) + 1
        out += list(recorded[last:start])
        last = end
        mine = cur.get(option, [])
        now = mine[seen[option]] if seen[option] < len(mine) else None
        if now is None:
            notes.append(f"model {name}: extra_args {option} is no longer in the inventory, "
                         "so the rollback runs without it")
            continue
        values = now[3]
        if [digest(str(v)) for v in values] == list(digests):
            out += _tokens(option, values, joined)
        else:
            notes.append(f"model {name}: extra_args {option} differs from the recorded one, "
                         "so the inventory's current value is used")
            out += list(current[now[0]:now[1]])
    return out + list(recorded[last:])


def _restore_entry(recorded, current):
    name = recorded.get("name")
    notes, out = [], dict(recorded)
    env_keys, options, whole = _redacted_parts(recorded)
    if env_keys:
        cur_env = current.get("env") if isinstance(current.get("env"), dict) else {}
        env = {}
        for key in env_keys:
            if key not in cur_env:
                notes.append(f"model {name}: env {key} is no longer in the inventory, so the "
                             "rollback runs without it")
            elif digest(cur_env[key]) == recorded["env"][key]:
                env[key] = cur_env[key]
            else:
                notes.append(f"model {name}: env {key} differs from the recorded one, so the "
                             "inventory's current value is used")
                env[key] = cur_env[key]
        out["env"] = env
    if options:
        out["extra_args"] = _restore_args(recorded["extra_args"], current.get("extra_args"),
                                          name, notes)
    for key in whole:
        if key not in current:
            notes.append(f"model {name}: {key} is no longer in the inventory, so the rollback "
                         "runs without it")
            del out[key]
        else:
            if digest(current[key]) != recorded[key]:
                notes.append(f"model {name}: {key} differs from the recorded one, so the "
                             "inventory's current value is used")
            out[key] = current[key]
    return out, notes


def restore_models(recorded, current):
    """The recorded vllm_server_models with each redacted value put back from the entry
    of the same name in `current` (the inventory's vllm_server_models now).

    A current value whose digest is the recorded one is the recorded value. One that
    differs, or is gone, cannot be: the current value is used (or the option or variable
    left out) and a note says which model and which env key, option or key (never a
    value). Returns (models, notes, missing): missing names what cannot be restored at
    all, each "model NAME (env KEY, extra_args OPTION, ...)", an entry with redacted
    values whose name is no longer in `current`.
    """
    by_name = {}
    for entry in current or []:
        if isinstance(entry, dict):
            by_name.setdefault(entry.get("name"), entry)
    models, notes, missing = [], [], []
    for entry in recorded or []:
        if not isinstance(entry, dict):
            models.append(entry)
            continue
        env_keys, options, whole = _redacted_parts(entry)
        if not (env_keys or options or whole):
            models.append(entry)
            continue
        if entry.get("name") not in by_name:
            parts = ([f"env {k}" for k in env_keys] + [f"extra_args {o}" for o, _value in options]
                     + list(whole))
            missing.append(f"model {entry.get('name')} ({', '.join(parts)})")
            continue
        restored, entry_notes = _restore_entry(entry, by_name[entry["name"]])
        models.append(restored)
        notes += entry_notes
    return models, notes, missing
