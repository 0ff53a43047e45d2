"""Real-looking English text from seeded word lists (no downloads, no model).

Everything is a pure function of a ``numpy.random.Generator``: the same seed
gives the same text. Lengths are measured with the real tokenizer by the caller
(:func:`fit_tokens`).
"""

from __future__ import annotations

from typing import Callable

import re

import numpy as np

ROLES = ("employee", "manager", "team lead", "contractor", "new hire", "supervisor",
         "reviewer", "coordinator", "intern", "department head", "officer", "mentor")
NOUNS = ("report", "expense claim", "badge", "laptop", "password", "timesheet", "budget",
         "schedule", "contract", "invoice", "request", "meeting", "deadline", "policy",
         "incident", "visitor", "parking permit", "training course", "vacation day",
         "customer record", "backup", "shipment", "purchase order", "safety check",
         "access card", "travel booking", "quarterly review", "project plan", "desk",
         "document", "complaint", "refund", "license", "server room", "first aid kit")
ADJECTIVES = ("urgent", "confidential", "overdue", "incomplete", "approved", "damaged",
              "missing", "shared", "temporary", "external", "internal", "unusual",
              "expensive", "recurring", "sensitive", "outdated", "signed", "pending",
              "routine", "critical")
# (base, third person, past participle)
VERBS = (("review", "reviews", "reviewed"), ("submit", "submits", "submitted"),
         ("approve", "approves", "approved"), ("record", "records", "recorded"),
         ("report", "reports", "reported"), ("archive", "archives", "archived"),
         ("check", "checks", "checked"), ("update", "updates", "updated"),
         ("sign", "signs", "signed"), ("return", "returns", "returned"),
         ("inspect", "inspects", "inspected"), ("confirm", "confirms", "confirmed"),
         ("escalate", "escalates", "escalated"), ("document", "documents", "documented"),
         ("replace", "replaces", "replaced"), ("schedule", "schedules", "scheduled"))
ADVERBS = ("promptly", "carefully", "in writing", "without delay", "at least once a week",
           "before noon", "by email", "in person", "every month", "as soon as possible")
PERIODS = ("week", "month", "quarter", "business day", "year", "shift", "pay period")
DEPARTMENTS = ("finance", "facilities", "security", "sales", "engineering", "legal",
               "support", "logistics", "marketing", "research", "operations", "training")
SUBJECTS = ("Expenses", "Security", "Travel", "Working Hours", "Equipment", "Visitors",
            "Leave", "Purchasing", "Data Protection", "Health and Safety", "Onboarding",
            "Conduct", "Remote Work", "Incidents", "Facilities", "Records")

_TEMPLATES = (
    "Every {adj} {noun} must be {pp} by the {role} before the end of the {period}.",
    "If a {noun} is {adj}, the {role} should {verb} it and {verb2} the {noun2} {adv}.",
    "The {role} {verb_s} each {noun} {adv}, unless the {noun2} is {adj}.",
    "A {role} who finds a {adj} {noun} has to {verb} it with the {dept} department.",
    "No {noun} may be {pp} without a {adj} {noun2} from the {role}.",
    "Questions about a {noun} go to the {dept} team, which {verb_s} them {adv}.",
    "When the {noun} is {adj}, please {verb} the {noun2} and inform your {role}.",
    "The {dept} department keeps every {pp} {noun} for one {period} and then {verb_s} it.",
    "Before a {noun} is {pp}, the {role} confirms that the {noun2} is not {adj}.",
    "Each {period}, the {role} {verb_s} the {adj} {noun} list {adv}.",
)


_ARTICLE = re.compile(r"\b([Aa]) (?=[aeiou])")


def fix_articles(text: str) -> str:
    """'a intern' -> 'an intern'."""
    return _ARTICLE.sub(lambda m: m.group(1) + "n ", text)


class TextGen:
    """Sentences, paragraphs and questions drawn from a seeded generator."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def pick(self, options: tuple):
        return options[int(self.rng.integers(len(options)))]

    def sentence(self) -> str:
        verb, verb2 = self.pick(VERBS), self.pick(VERBS)
        return fix_articles(self.pick(_TEMPLATES).format(
            adj=self.pick(ADJECTIVES), noun=self.pick(NOUNS), noun2=self.pick(NOUNS),
            role=self.pick(ROLES), period=self.pick(PERIODS), dept=self.pick(DEPARTMENTS),
            adv=self.pick(ADVERBS), verb=verb[0], verb2=verb2[0], verb_s=verb[1], pp=verb[2],
        ))

    def paragraph(self, sentences: int = 4) -> str:
        return " ".join(self.sentence() for _ in range(sentences))

    def question(self, section: str | None = None) -> str:
        noun, adj, role = self.pick(NOUNS), self.pick(ADJECTIVES), self.pick(ROLES)
        where = f"section '{section}'" if section else "the handbook"
        return fix_articles(self.pick((
            f"According to {where}, what should a {role} do with a {adj} {noun}?",
            f"Who has to approve a {adj} {noun}, and how quickly, according to {where}?",
            f"What does {where} say about a {noun} that is {adj}?",
            f"Is a {role} allowed to keep a {adj} {noun}? Please answer using {where}.",
        )))

    def preamble(self) -> str:
        """A short first-person context sentence that makes a question read naturally."""
        dept, period = self.pick(DEPARTMENTS), self.pick(PERIODS)
        return self.pick((
            f"I joined the {dept} team this {period} and I am still learning the rules.",
            f"I work in {dept} and a colleague asked me something I could not answer.",
            f"My manager in {dept} is away this {period}, so I am asking you instead.",
        ))


def fit_tokens(piece: Callable[[], str], count: Callable[[str], int], target: int,
               sep: str = " ", head: str = "") -> str:
    """Join ``piece()`` outputs after ``head`` until the text has >= ``target`` tokens.

    Overshoots by at most one piece (a sentence or paragraph); never returns an
    empty string when ``target`` > 0.
    """
    text = head
    while count(text) < target:
        text = f"{text}{sep}{piece()}" if text else piece()
    return text


def handbook(gen: TextGen, count: Callable[[str], int], target: int,
             paragraphs_per_section: int = 2) -> tuple[str, list[str]]:
    """A handbook of about ``target`` tokens; returns (text, section titles in order)."""
    titles: list[str] = []
    sections: list[str] = []
    subjects = list(SUBJECTS)
    gen.rng.shuffle(subjects)

    def next_section() -> str:
        title = subjects[len(titles) % len(subjects)]
        if len(titles) >= len(subjects):
            title = f"{title} ({len(titles) // len(subjects) + 1})"
        titles.append(title)
        body = "\n\n".join(gen.paragraph(int(gen.rng.integers(3, 6)))
                           for _ in range(paragraphs_per_section))
        sections.append(f"## {len(titles)}. {title}\n\n{body}")
        return sections[-1]

    text = fit_tokens(next_section, count, target, sep="\n\n", head="# Employee Handbook")
    return text, titles
