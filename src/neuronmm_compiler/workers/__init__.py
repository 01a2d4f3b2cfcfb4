"""Processes and cores: how many cores nmmc may use (:mod:`.cores`) and one function run in a worker process
while this one goes on (:mod:`.background`). Standard library only; every subsystem may import it."""
