"""gpufleet's decisions as plain Python (no Ansible imports in this package).

arch      the one compute capability -> architecture table and parser
gpu       GPU facts: NVML, `nvidia-smi -q -x`, the PCI bus; product tables
cuda      driver / CUDA / architecture / image compatibility (NVIDIA_REQUIRE_CUDA)
tune      vLLM serving settings from GPU facts and a model folder
hub       Hugging Face mirror client: listing, verified parallel download, manifest
prometheus_text  the one reader of Prometheus text (vLLM's /metrics), with prometheus-client

The modules in plugins/modules/ are thin shells around these; tests/unit tests them directly.
"""
