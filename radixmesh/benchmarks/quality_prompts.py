"""The fixed prompts of the bf16 quality figure (bf16_quality.py): chat and plain text,
short and long, on varied topics. Fixed so that two runs, or two machines, compare the
same positions; a change here changes the figure (say so where it is quoted).

A chat prompt is a list of messages (the model's chat template applied, with the
assistant's turn opened); a plain prompt is text the model continues.
"""

from __future__ import annotations

_LONG_TEXT = (
    "The history of the bicycle begins in the early nineteenth century. In 1817 Karl Drais, a "
    "German forester, built a two-wheeled running machine that the rider pushed along with his "
    "feet. It had no pedals and no chain, but it proved that a person could balance on two wheels "
    "in a line. Over the following decades inventors in France and Britain added cranks and pedals "
    "to the front wheel, and the front wheel grew larger and larger so that each turn of the "
    "pedals carried the rider further. These high-wheelers were fast but dangerous: a rider who "
    "hit a stone could be thrown over the handlebars. The safety bicycle of the 1880s, with two "
    "wheels of equal size and a chain driving the rear wheel, solved the problem, and the "
    "pneumatic tyre made it comfortable. Within a few years millions of people were riding."
)

_LONG_CODE = '''import heapq


def dijkstra(graph, source):
    """Shortest distances from source in a graph of non-negative edge weights.

    graph maps each node to a list of (neighbour, weight) pairs.
    """
    dist = {source: 0}
    queue = [(0, source)]
    done = set()
    while queue:
        d, node = heapq.heappop(queue)
        if node in done:
            continue
        done.add(node)
        for neighbour, weight in graph.get(node, []):
            candidate = d + weight
'''

_LONG_LETTER = (
    "Dear residents,\n\nAs many of you know, the library on Elm Street will close for renovation "
    "from the first of March until the end of August. During this time the reading room, the "
    "children's corner and the computer desks will not be available. Books already on loan may be "
    "returned at the town hall, where a small collection of new titles will also be on offer. The "
    "renovation will replace the leaking roof, add a lift to the first floor and enlarge the study "
    "area, which has been too small for years. We know that the closure is an inconvenience, "
    "especially for students preparing for their exams, and we have arranged"
)

CHAT: list[list[dict[str, str]]] = [[{"role": "user", "content": c}] for c in (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colors.",
    "How do I boil an egg?",
    "Explain what a CPU does in one sentence.",
    "Give me a short recipe for pancakes.",
    "What is the difference between weather and climate?",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Write a Python function that reverses a string.",
    "Suggest a name for a grey cat.",
    "What are the planets of the solar system, in order?",
    "How many days are there in a leap year?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What should I pack for a weekend hiking trip?",
    "Explain recursion to a ten-year-old.",
    "Is a tomato a fruit or a vegetable?",
    "Write a polite email declining a meeting invitation.",
    "What is photosynthesis?",
    "Give three tips for sleeping better.",
    "hi",
    "Tell me a joke about computers.",
    "What does HTTP stand for?",
    "Compare cats and dogs as pets.",
    f"Summarize this text in one sentence:\n\n{_LONG_TEXT}",
    f"What does this function do, and what is missing from it?\n\n{_LONG_CODE}",
    f"Rewrite this notice in three short bullet points:\n\n{_LONG_LETTER}",
)] + [
    [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
     {"role": "user", "content": "How far is the Moon from the Earth?"}],
    [{"role": "user", "content": "I have two apples and buy three more. How many do I have?"},
     {"role": "assistant", "content": "You have five apples."},
     {"role": "user", "content": "And if I eat one of them?"}],
    [{"role": "user", "content": "Name a famous painter."},
     {"role": "assistant", "content": "Vincent van Gogh."},
     {"role": "user", "content": "What is his best known painting?"}],
]

PLAIN: list[str] = [
    "The quick brown fox",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "The three primary colors are",
    "Paris is the capital of",
    "The most important thing to remember when learning a new language is",
    "import numpy as np\n\ndef softmax(x):\n",
    "Water boils at 100 degrees Celsius at sea level, but at higher altitudes",
    "Dear Sir or Madam,\n\nI am writing to",
    "In mathematics, a prime number is",
    "The recipe calls for two cups of flour,",
    "Monday: meetings. Tuesday: code review. Wednesday:",
    "SELECT name, age FROM users WHERE",
    "The first law of thermodynamics states that",
    "Q: What is the largest ocean on Earth?\nA:",
    "It was a dark and stormy night;",
    "<html>\n<head>\n<title>",
    "The stock market fell sharply on Tuesday after",
    "A good night's sleep",
    "Machine learning is a field of study that",
    "The children ran to the beach and",
    _LONG_TEXT,
    _LONG_CODE,
    _LONG_LETTER,
]


def prompts() -> list[tuple[str, object]]:
    """Every prompt as ``(kind, prompt)``: kind ``chat`` (messages) or ``plain`` (text)."""
    return [("chat", c) for c in CHAT] + [("plain", p) for p in PLAIN]
