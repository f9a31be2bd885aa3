"""gpufleet's decisions as plain Python (no Ansible imports in this package).

The modules in plugins/modules/ and the filters in plugins/filter/ are thin shells around
these files; tests/unit tests them directly (pytest.ini puts plugins/module_utils on the
path, so `from gpufleet import tune` works without Ansible). One file per subject:

GPUs and the host stack
  arch             the one compute capability -> architecture table and its parser
  gpu              GPU facts: NVML, `nvidia-smi -q -x`, the PCI bus; product tables
  cuda             can this host run that image: the verdict of cuda_compat (check)
  cuda_versions    NVIDIA's driver / CUDA / architecture tables and their version parsers
  require_cuda     an image's NVIDIA_REQUIRE_CUDA as libnvidia-container evaluates it; its
                   CUDA version and kernel architectures from its labels
  compat_libs      the image's CUDA forward-compat libcuda and whether the toolkit loads it
  hoststack        NVIDIA repositories, driver packages and versions, per distribution
  hoststate        a host's state record: is it exactly as its last full site.yml run left it

Models and their weights
  hub              a verified model fetch from a Hugging Face hub or mirror: sync_repo (one
                   commit's files into dest), a lock written from a hub or a verified folder;
                   the fetch's errors (named in its __all__)
  hub_errors       the fetch's errors (HubError and the ones every step raises)
  hub_names        what a repo id, revision, listed path or endpoint URL may be; a path under
                   a root that no link leads out of; credentials kept out of messages
  hub_listing      a commit's listing: its files (RepoFile) and what their bytes hash to,
                   allow/ignore patterns
  hub_client       the HTTP client (requests): retries, redirects, the token's origin, byte
                   caps, minimum rate, deadline
  hub_manifest     dest's state folder: the verified manifest and what a re-run trusts
  hub_fetch        the bytes: streamed, hashed, resumed, quarantined, renamed; free space first
  hub_mirror       the site mirror: verified folders as a static tree nginx serves
  revisions        model revisions side by side: one folder per commit, the served link
  model_lock       a model's lock: commit and every file's sha256, pinned on the control node
  p2p              peer-to-peer fan-out of verified folders (libtorrent): the engine (run_peer),
                   hf_model's runner, every file re-hashed; its errors (named in __all__)
  p2p_errors       p2p's errors (P2PError, WebSeedDown)
  p2p_torrent      what a torrent of a verified folder holds, the checks a host applies to one,
                   the mirror's torrents
  p2p_swarm        who a host's session may talk to (settings, address filter) and when it may
                   use the mirror's web seed
  p2p_plan         model_fetch's p2p plan: transports, seed policies, ports, rates, the fleet's
                   addresses, each host's job
  p2p_seeder       the detached seeder: started, found again, stopped
  fetch_wait       the model fetch wait's options and progress line

Tuning vLLM
  model            a model's description (layers, heads, KV layout) from its folder or its
                   config.json; the weights' bytes from safetensors headers
  model_description  ModelDescription, the typed record describe builds and the tuner reads
                   by attribute (as_dict() at the modules' boundary)
  model_families   what each family's config means for its KV cache: the tables keyed by
                   model_type and FAMILY_RULES, the per-family rules describe_config applies
  model_fields     a model description's errors and the checks of one config field
  tune             the planner behind vllm_tune: settings, checks, reasons, `vllm serve` args
  tune_errors      the tuner's errors (TuneError, NoFitError)
  tune_plan        TunePlan and its Prediction, the typed records the tuner returns
                   (as_dict() at the module's boundary)
  kv_memory        the KV cache as vLLM lays it out: pages, blocks, tokens, concurrency,
                   pipeline stages
  kv_log           what vLLM's start-up log says about the KV cache, against a prediction
  serve_dtype      the dtypes vLLM serves with on a GPU: weights (--dtype), KV cache, quantization
  vllm_flags       vLLM flags and defaults that depend on its version; version comparison
  deepseek_v4      DeepSeek-V4's KV cache as vLLM 0.32.0 plans it
  speculative      speculative decoding (EAGLE, MTP, n-gram) as vLLM 0.32.0 sizes it
  engine_args      every `vllm serve` argument, classified (read, refused, passed through);
                   a model entry's extra_args checked (secrets, --trust-remote-code); a
                   plan's settings as the `vllm serve` argument list (serve_args)

Serving, the gateway, rollouts
  serve            containers to run, addresses, keys, the argument check, the instance list
  serve_ready      the readiness gate: /health, /v1/models, one real request, bounded
  serve_diagnosis  what a vLLM container's log says went wrong: causes and fixes
  gateway          HAProxy backends, routes read from /openapi.json, server states
  tls              certificate and key checks, names a fleet-CA certificate holds
  upgrade          batches, gates, the last-good record and its rollback
  rollout          a rollout's durable state on each host, the fleet-wide lock
  redact           what in a model entry is a secret, and how it is kept out of files

Benchmarks
  bench            the matrix to run and the `vllm bench serve` runs that measure it (flags,
                   instances, the container's environment)
  bench_results    what one saved `vllm bench serve` result says: a point, a failed point, a row
  bench_analysis   what a curve says: the knee, the cliff, the findings; the knee as facts
  bench_gpu        GPU utilisation during a point (`nvidia-smi dmon`)
  bench_report     the run folder: raw results, CSV, plots, HTML

Shared rules
  grammar          one grammar per input that reaches a configuration or a command line
  options          ranges of module options beyond Ansible's types
  bounded          bounded reads: a byte cap and an overall deadline on every answer
  jsonfile         small JSON state files: owner and mode checked on read (NotPrivateError),
                   written atomically
  prometheus_text  the one reader of Prometheus text, with prometheus-client
"""
