"""Benchmarks and their peers, apart from the library: `specdec bench` (methods.py: every method
side by side, peers.py: transformers and llama.cpp beside them), `specdec bench-serve` (serve.py,
serve_load.py: load on OpenAI-compatible servers), llama_cpp.py (drives llama.cpp's binaries),
pass_costs.py (a pass's cost by width). Nothing outside this package and the CLI imports it."""
