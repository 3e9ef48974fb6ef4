# Convenience targets; the scripts are the source of truth.
.PHONY: simulator test bench embed
simulator:
	scripts/simulator
test:
	scripts/test
bench:
	scripts/bench
embed:
	scripts/embed-boards
