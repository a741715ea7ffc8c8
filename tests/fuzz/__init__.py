"""A wire fuzzer for a real member: `python -m tests.fuzz --count 100000 --seed 1` (`make fuzz`).

`cases.py` draws messages (framing errors, BSON mutations, the command grammar of
every registered command, legacy opcodes) and says what a correct member must do
with each; `http_cases.py` does the same for the HTTP status port; `runner.py`
sends them over many reused connections and checks every outcome, the member's
health after each chunk and its log at the end.
"""
