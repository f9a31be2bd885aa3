"""Test doubles for a Hugging Face hub (loopback only).

`server.HubStub` is a STAND-IN for huggingface.co or a company mirror: a real HTTP server
on 127.0.0.1 that speaks the API subset hf_model uses. `faultproxy.FaultProxy` is a
fault-injecting reverse proxy put between the client and a mirror. Neither is a mirror
to run in production; the site mirror role (nginx) is.
"""
