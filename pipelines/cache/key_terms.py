"""Key terms a semantic cache hit must share: the words whose change changes the answer
while barely moving a sentence embedding (numbers, negation, polarity, units, names and
their order). A prompt whose nearest cached neighbour differs in them is a miss, however
similar the embeddings: a missed hit costs one generation, a false hit a wrong answer."""
import re

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9+#]*(?:'[A-Za-z]+)?|\d+(?:[.,]\d+)*")
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion dozen half single double triple first second third fourth fifth".split())
NEGATIONS = frozenset("not no never none nothing nobody neither nor without cannot".split())
UNITS = frozenset(
    "mile miles kilometre kilometres kilometer kilometers km metre metres meter meters cm mm foot feet inch inches "
    "yard yards pound pounds lb lbs kilogram kilograms kg gram grams ounce ounces oz celsius fahrenheit kelvin "
    "dollar dollars euro euros yen usd eur gbp jpy litre litres liter liters gallon gallons cup cups "
    "second seconds minute minutes hour hours day days week weeks month months year years percent mph kph "
    "byte bytes kb mb gb tb megabyte megabytes megabit megabits gigabyte gigabytes gigabit gigabits kilobyte "
    "kilobytes kilobit kilobits calorie calories watt watts volt volts".split())
# Words of opposite sense in one group: a prompt's group members must agree in sign.
_POLAR = {
    "good": ("good", 1), "bad": ("good", -1), "safe": ("safe", 1), "unsafe": ("safe", -1),
    "toxic": ("safe", -1), "dangerous": ("safe", -1), "harmful": ("safe", -1),
    "for": ("for", 1), "favor": ("for", 1), "favour": ("for", 1), "against": ("for", -1),
    "pros": ("pros", 1), "cons": ("pros", -1), "advantages": ("adv", 1), "disadvantages": ("adv", -1),
    "benefits": ("adv", 1), "drawbacks": ("adv", -1), "risks": ("adv", -1),
    "best": ("best", 1), "worst": ("best", -1), "better": ("better", 1), "worse": ("better", -1),
    "increase": ("inc", 1), "decrease": ("inc", -1), "raise": ("inc", 1), "lower": ("inc", -1),
    "more": ("more", 1), "less": ("more", -1), "fewer": ("more", -1), "most": ("more", 1), "least": ("more", -1),
    "before": ("time", 1), "after": ("time", -1), "up": ("up", 1), "down": ("up", -1),
    "hot": ("hot", 1), "cold": ("hot", -1), "fast": ("fast", 1), "slow": ("fast", -1),
    "cheap": ("cheap", 1), "expensive": ("cheap", -1), "true": ("true", 1), "false": ("true", -1),
    "buy": ("buy", 1), "sell": ("buy", -1), "win": ("win", 1), "lose": ("win", -1),
    "start": ("start", 1), "stop": ("start", -1), "enable": ("on", 1), "disable": ("on", -1),
    "add": ("add", 1), "remove": ("add", -1), "healthy": ("healthy", 1), "unhealthy": ("healthy", -1),
    "legal": ("legal", 1), "illegal": ("legal", -1), "possible": ("possible", 1), "impossible": ("possible", -1),
    "likely": ("likely", 1), "unlikely": ("likely", -1), "easy": ("easy", 1), "hard": ("easy", -1),
    "difficult": ("easy", -1), "strengths": ("strong", 1), "weaknesses": ("strong", -1),
    "on": ("on", 1), "off": ("on", -1), "like": ("like", 1), "dislike": ("like", -1), "love": ("like", 1),
    "hate": ("like", -1), "ascending": ("asc", 1), "descending": ("asc", -1), "encode": ("code", 1),
    "decode": ("code", -1), "encrypt": ("crypt", 1), "decrypt": ("crypt", -1), "eat": ("eat", 1),
    "avoid": ("eat", -1), "praising": ("praise", 1), "criticizing": ("praise", -1), "criticising": ("praise", -1),
    "edible": ("safe", 1), "poisonous": ("safe", -1), "briefly": ("brief", 1), "brief": ("brief", 1),
    "short": ("brief", 1), "detail": ("brief", -1), "depth": ("brief", -1), "detailed": ("brief", -1),
    "long": ("brief", -1), "import": ("port", 1), "export": ("port", -1), "upload": ("load", 1),
    "download": ("load", -1), "open": ("open", 1), "close": ("open", -1), "include": ("incl", 1),
    "exclude": ("incl", -1), "accept": ("accept", 1), "reject": ("accept", -1), "allow": ("allow", 1),
    "block": ("allow", -1), "deny": ("allow", -1),
}
# A conversion names what it goes from and to: in a prompt with one of these words, the
# word after each `from`, `to` and `into` (past an article) is a key term in its place.
_DIRECTIONAL = frozenset("from convert converting translate transfer switch turn change move rewrite send go "
                         "travel directions migrate port".split())
_ARTICLES = frozenset("a an the this that my your our their its".split())


def _directions(words: list[str]) -> list[tuple[str, str]]:
    if not _DIRECTIONAL.intersection(words):
        return []
    out = []
    for i, w in enumerate(words):
        if w in ("from", "to", "into"):
            rest = [x for x in words[i + 1:i + 4] if x not in _ARTICLES]
            if rest:
                out.append(("to" if w == "into" else w, rest[0]))
    return sorted(out)


def _words(text: str) -> list[tuple[str, bool]]:
    """Each word lower-cased, with whether it is a name (capitalised, not a sentence's first)."""
    out, start = [], True
    for m in _WORD.finditer(text.replace("\u2019", "'")):
        raw = m.group(0)
        word = raw.lower()
        if word.endswith("'s"):
            word = word[:-2]
        if word.endswith("n't"):
            out.append(("not", False))
            word = word[:-3]
        name = not start and any(c.isupper() for c in raw) and word != "i"
        out.append((word, name))
        tail = text[m.end():m.end() + 2]
        start = bool(re.match(r"\s*[.?!:]", tail))
    return out


def agree(a: str, b: str) -> bool:
    """Whether two prompts share their key terms: the same numbers, the same parity of
    negation, no polarity group with opposite senses, and the same names and units (a
    word capitalised mid-sentence in either prompt), present in both in the same order."""
    wa, wb = _words(a), _words(b)
    numbers = [sorted(w for w, _ in ws if w[0].isdigit() or w in NUMBER_WORDS) for ws in (wa, wb)]
    negated = [sum(w in NEGATIONS for w, _ in ws) % 2 for ws in (wa, wb)]
    if numbers[0] != numbers[1] or negated[0] != negated[1]:
        return False
    senses = [{}, {}]
    for i, ws in enumerate((wa, wb)):
        for w, _ in ws:
            if w in _POLAR:
                group, sign = _POLAR[w]
                senses[i].setdefault(group, set()).add(sign)
    if any(senses[1][g] != signs for g, signs in senses[0].items() if g in senses[1]):
        return False
    if _directions([w for w, _ in wa]) != _directions([w for w, _ in wb]):
        return False
    named = {w for ws in (wa, wb) for w, name in ws if name or w in UNITS}
    order = [list(dict.fromkeys(w for w, _ in ws if w in named)) for ws in (wa, wb)]
    return order[0] == order[1]
