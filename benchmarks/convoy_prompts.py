"""The prompts the Convoy benchmarks send, one per client (convoy.py in process, convoy_servers.py over HTTP).

Owns: the list only; scripts beside it import it by name (running `python benchmarks/X.py` puts this
folder on sys.path).
"""

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle gear works.",
    "List some facts about the moon.",
    "Describe a walk through a forest in autumn.",
    "What makes bread rise?",
    "Tell me about the history of the violin.",
    "How do bees make honey?",
    "Give advice for a first job interview.",
]
