"""The vocabulary every layer shares: run configurations, records and their schema, statistics, the one error type
for bad input, device discovery, and the markers rank processes print and launchers read. Imports nothing else
from the project."""
