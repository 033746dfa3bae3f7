"""Everyday modern English sentences for the cadenza-tiny corpus, generated from templates so nothing needs downloading.

The Bible text of `sentences.py` is archaic prose; a small TTS model trained on it alone has rarely heard plain modern
speech (phones, emails, meetings, bus times, shopping lists). This module fills about a hundred sentence templates
(statements, questions, requests, exclamations, short dialogue lines) from word pools: first names of many origins,
cities, places, foods, objects, jobs, weekdays, months, spelled-out clock times and numbers, colors, activities in
several tenses, weather, travel, shopping, work, family and technology words. Output is deterministic for a seed, has
no digits (numbers are written as words) and only ASCII letters, spaces, commas, apostrophes and final . ? or !.

    python recipes/tiny/everyday.py --count 30000 --seed 0 > everyday.txt
"""

from __future__ import annotations

import argparse
import math
import random
import re
from typing import NamedTuple


class Activity(NamedTuple):
    base: str  # clean the kitchen
    past: str  # cleaned the kitchen
    ing: str  # cleaning the kitchen
    pp: str  # cleaned the kitchen (past participle)


def _p(text: str) -> list[str]:
    """A pool from a '|'-separated string."""
    return [w.strip() for w in text.split("|") if w.strip()]


def _activities(text: str) -> list[Activity]:
    """'base,past,ing,participle object' entries separated by '|', e.g. 'write,wrote,writing,written a report'."""
    out = []
    for entry in _p(text):
        forms, _, rest = entry.partition(" ")
        tail = f" {rest}" if rest else ""
        out.append(Activity(*(f + tail for f in forms.split(","))))
    return out


_ONES = _p("one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|"
           "seventeen|eighteen|nineteen")
_TENS = _p("twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety")


def number_words(n: int) -> str:
    """1..99 in words, without hyphens: 23 -> 'twenty three'."""
    if not 1 <= n <= 99:
        raise ValueError(f"number out of range: {n}")
    if n < 20:
        return _ONES[n - 1]
    tens, ones = divmod(n, 10)
    return _TENS[tens - 2] + (f" {_ONES[ones - 1]}" if ones else "")


_HOURS = _ONES[:12]
_TIMES = ([f"half past {h}" for h in _HOURS] + [f"a quarter past {h}" for h in _HOURS]
          + [f"a quarter to {h}" for h in _HOURS] + [f"{h} o'clock" for h in _HOURS]
          + [f"ten past {h}" for h in _HOURS] + [f"twenty to {h}" for h in _HOURS]
          + [f"{h} in the morning" for h in _HOURS[4:11]] + [f"{h} in the evening" for h in _HOURS[4:11]]
          + ["noon", "midnight", "lunchtime"])
_JOBS = _p("nurse|teacher|doctor|engineer|chef|pilot|plumber|lawyer|dentist|farmer|baker|electrician|architect|"
           "accountant|journalist|photographer|firefighter|police officer|mechanic|designer|programmer|librarian|"
           "pharmacist|waiter|cashier|painter|musician|scientist|carpenter|bus driver|taxi driver|vet|hairdresser|"
           "gardener|receptionist|manager|student|tour guide|flight attendant|software developer")

POOLS: dict[str, list] = {
    "name": _p("Emma|Liam|Olivia|Noah|Sofia|Mateo|Aisha|Omar|Priya|Arjun|Mei|Wei|Yuki|Kenji|Fatima|Ahmed|Chloe|Lucas|"
               "Isabella|Diego|Carlos|Maria|Elena|Ivan|Olga|Anna|Lars|Ingrid|Kwame|Amara|Chidi|Zara|Hassan|Leila|"
               "Ravi|Anjali|Hana|Jin|Minh|Linh|Tomas|Lucia|Pedro|Ana|Grace|James|Daniel|Sarah|Michael|Laura|David|"
               "Rachel|Samuel|Hannah|Ben|Lily|Jack|Ella|Ethan|Mia|Nadia|Yusuf|Ali|Sana|Declan|Aoife|Niamh|Sean|Freya|"
               "Oscar|Theo|Ruby|Kofi|Ayesha|Rohan|Tariq|Maya|Leo|Nina|Sven|Katya|Jamal|Tanya|Marco|Giulia|Paolo|"
               "Sakura|Hiro|Soo|Tendai|Nia|Jorge|Camila|Tom|Kate|Peter|Alice|Sam|Rosa"),
    "city": _p("London|Paris|Tokyo|Chicago|Toronto|Sydney|Madrid|Berlin|Rome|Cairo|Nairobi|Mumbai|Seoul|Lisbon|Dublin|"
               "Boston|Denver|Vienna|Amsterdam|Prague|Athens|Istanbul|Mexico City|New York|San Francisco|Seattle|"
               "Miami|Vancouver|Montreal|Melbourne|Auckland|Singapore|Bangkok|Delhi|Lagos|Cape Town|Oslo|Stockholm|"
               "Edinburgh|Manchester|Barcelona|Munich|Warsaw|Budapest|Houston|Atlanta|Lima|Buenos Aires"),
    "place": _p("the library|the station|the park|the bakery|the post office|the gym|the hospital|the bank|"
                "the office|the museum|the airport|the supermarket|the cinema|the beach|the coffee shop|"
                "the bus stop|the school gate|the pharmacy|the town hall|the car park|the market|the bookshop|"
                "the swimming pool|the front entrance|the train station|the corner shop|the hotel lobby"),
    "shop": _p("supermarket|bakery|pharmacy|hardware store|bookshop|butcher|flower shop|corner shop|shoe shop|"
               "post office|bank|dry cleaner|garden center|pet shop|phone shop|toy store"),
    "food": _p("pasta|rice|soup|pizza|salad|bread|cheese|chicken|fish|noodles|curry|eggs|pancakes|toast|yogurt|"
               "strawberries|apples|bananas|potatoes|carrots|tomatoes|chocolate cake|ice cream|orange juice|milk|"
               "coffee|tea|sandwiches|tacos|dumplings|sushi|lentil soup|roast vegetables|fried rice|oatmeal|"
               "grilled fish|apple pie|burgers|spaghetti|mushrooms|onions|peppers|grapes|cereal|butter|honey"),
    "dish": _p("soup|curry|pizza|pie|bread|cake|stew|pasta|omelet|risotto|chili|roast chicken|apple crumble|"
               "lasagna|fried rice|vegetable soup|banana bread|pancake batter"),
    "obj": _p("keys|wallet|umbrella|glasses|phone|laptop|charger|headphones|passport|jacket|backpack|notebook|"
              "water bottle|scarf|gloves|bike helmet|library card|sunglasses|lunch box|house keys|car keys|"
              "remote control|blue folder|train ticket|reading glasses|coffee mug|tablet|camera|watch|purse"),
    "plural": _p("chairs|plates|cups|tickets|boxes|eggs|apples|balloons|candles|napkins|forks|bottles|sandwiches|"
                 "copies|pages|towels|blankets|pens|envelopes|invitations|folders|batteries|lemons|potatoes"),
    "job": _JOBS,
    "job_a": [("an " if j[0] in "aeiou" else "a ") + j for j in _JOBS],
    "day": _p("Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"),
    "month": _p("January|February|March|April|May|June|July|August|September|October|November|December"),
    "time": _TIMES,
    "num": [number_words(n) for n in range(2, 100)],
    "few": [number_words(n) for n in range(2, 13)],
    "ordinal": _p("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|fifteenth|"
                  "twentieth|twenty first|thirtieth"),
    "color": _p("red|blue|green|yellow|black|white|gray|orange|purple|pink|brown|dark blue|light green|silver"),
    "rel": _p("sister|brother|mother|father|aunt|uncle|cousin|grandmother|grandfather|neighbor|son|daughter|wife|"
              "husband|best friend|roommate|boss|teacher|mom|dad|grandma|grandpa|niece|nephew"),
    "room": _p("kitchen|living room|bedroom|bathroom|hallway|garage|basement|office|dining room|spare room|attic"),
    "furniture": _p("table|shelf|desk|sofa|chair|counter|windowsill|bed|bookcase|dresser|fridge"),
    "appliance": _p("oven|stove|lights|heater|iron|kettle|washing machine|television|air conditioner|radio|fan|tap"),
    "transport": _p("bus|train|ferry|tram|subway|coach|flight|shuttle"),
    "vehicle": _p("car|bike|van|scooter|truck|motorbike"),
    "clothing": _p("coat|jacket|sweater|scarf|hat|dress|shirt|raincoat|pair of boots|pair of shoes|hoodie|skirt|suit"),
    "weather": _p("sunny|cloudy|windy|rainy|foggy|freezing|humid|chilly|stormy|warm|hot|cold|snowy|mild"),
    "sky": _p("rain|snow|clear up|get warmer|get colder|be windy|thunder|drizzle"),
    "tech": _p("phone|laptop|tablet|computer|printer|router|smartwatch|keyboard|mouse|headset|webcam|speaker"),
    "site": _p("website|email account|bank account|online store|photo app|work account|video call app|calendar"),
    "doc": _p("report|slides|invoice|contract|spreadsheet|meeting notes|schedule|budget|receipt|agenda|draft|"
              "photos|address|link|password|form|timetable|menu|shopping list|recipe"),
    "event": _p("meeting|concert|wedding|party|game|interview|lecture|presentation|birthday dinner|class|match|"
                "video call|movie|school play|workshop|conference|job interview|barbecue"),
    "feeling": _p("excited|nervous|happy|worried|thrilled|unsure|curious|relaxed|anxious|pleased|confident"),
    "street": _p("Main Street|Park Road|River Lane|Oak Avenue|High Street|Station Road|Elm Street|Church Lane|"
                 "Mill Road|King Street|Market Street|Hill Road|Bridge Street|Maple Drive"),
    "landmark": _p("traffic lights|roundabout|gas station|church|big supermarket|school|bridge|second corner|"
                   "post office|old theater|playground"),
    "currency": _p("dollars|euros|pounds"),
    "season": _p("summer|winter|spring|autumn|fall|year|month|week|weekend"),
    "skill": _p("swim|drive|cook|knit|paint|dance|sing|play the piano|play the guitar|speak Spanish|speak Japanese|"
                "ride a bike|bake bread|code|surf|ski|skate|draw|take photos|play chess"),
    "gift": _p("flowers|book|card|chocolates|lovely scarf|birthday present|plant|mug|candle|cookies|tea set|voucher"),
    "delay": _p("late|cancelled|full|stuck in traffic|delayed|diverted|running slow|very crowded"),
    "please": _p("close the window|pass the salt|speak a little louder|open the door|turn the music down|"
                 "send me the address|call me back later|wait here a moment|hold this for a second|help me carry this|"
                 "spell your last name|repeat that|check the time|lock the back door|water the plants|feed the cat|"
                 "walk the dog|take out the trash|switch on the lights|sign this form|move your car"),
    "act": _activities(
        "clean,cleaned,cleaning,cleaned the kitchen|wash,washed,washing,washed the car|"
        "do,did,doing,done the laundry|write,wrote,writing,written a report|cook,cooked,cooking,cooked dinner|"
        "walk,walked,walking,walked the dog|call,called,calling,called my mother|read,read,reading,read the news|"
        "fix,fixed,fixing,fixed the sink|pay,paid,paying,paid the bills|buy,bought,buying,bought groceries|"
        "book,booked,booking,booked the tickets|water,watered,watering,watered the plants|"
        "charge,charged,charging,charged my phone|answer,answered,answering,answered my emails|"
        "update,updated,updating,updated my laptop|back,backed,backing,backed up the files|"
        "pack,packed,packing,packed my suitcase|bake,baked,baking,baked a cake|paint,painted,painting,painted the fence|"
        "mow,mowed,mowing,mowed the lawn|feed,fed,feeding,fed the cat|make,made,making,made breakfast|"
        "iron,ironed,ironing,ironed my shirts|vacuum,vacuumed,vacuuming,vacuumed the stairs|"
        "take,took,taking,taken out the trash|print,printed,printing,printed the tickets|"
        "check,checked,checking,checked the weather|sweep,swept,sweeping,swept the porch|"
        "finish,finished,finishing,finished the slides|practice,practiced,practicing,practiced the piano|"
        "change,changed,changing,changed my password|sort,sorted,sorting,sorted the recycling|"
        "lock,locked,locking,locked the door|empty,emptied,emptying,emptied the dishwasher|"
        "fold,folded,folding,folded the towels|tidy,tidied,tidying,tidied my desk|"
        "renew,renewed,renewing,renewed my passport|order,ordered,ordering,ordered a pizza|"
        "visit,visited,visiting,visited my grandparents|go,went,going,gone for a run|"
        "fill,filled,filling,filled up the car|plan,planned,planning,planned the trip"),
}

TEMPLATES: list[str] = [
    # plain statements
    "{name} is meeting my {rel} at {place} on {day}.", "I left my {obj} at {place} this morning.",
    "The meeting has been moved to {day} at {time}.", "We need {num} more {plural} for the party.",
    "{name} works as {job_a} in {city}.", "My {rel} just bought a {color} {vehicle}.",
    "The flight to {city} was delayed by {num} minutes.", "I will be there in about {num} minutes.",
    "The {obj} is on the {furniture} in the {room}.", "{name} said the {event} starts at {time}.",
    "The tickets cost {num} {currency} each.", "We are painting the {room} {color} in {month}.",
    "My {rel} is {act.ing} in the {room} right now.", "I just sent you an email with the {doc}.",
    "The {job} said I should rest for {few} days.", "There were about {num} people at the {event} last night.",
    "{name} wants to become {job_a} one day.", "The {dish} at the cafe on {street} is really good.",
    "{name} is {feeling} about the new job in {city}.", "The {obj} you ordered should arrive on {day}.",
    "It took {name} {num} minutes to find a parking space.", "My {rel} was born in {city} in {month}.",
    "Your order of {num} {plural} is ready for pickup.", "The printer on the {ordinal} floor is out of paper again.",
    "Our office is on the {ordinal} floor, next to the {room}.", "The rent is due on the {ordinal} of {month}.",
    "{name} and {name2} are flying to {city} in {month}.", "The {shop} closes at {time} on {day}s.",
    "My {tech} battery died in the middle of the {event}.", "My {tech} keeps restarting every few minutes.",
    "We ran out of {food}, so I'll go to the {shop}.", "{name} is learning to {skill} this {season}.",
    "The {transport} to {city} leaves at {time}, so we should hurry.",
    "It is going to be {weather} all weekend, so bring a {clothing}.",
    "It is {weather} in {city} today, and it might {sky} later.", "{name} bought {few} {plural} at the {shop}.",
    "Our neighbors in {city} have a {color} front door.", "The new {job} who lives on {street} is very friendly.",
    # tenses
    "I was {act.ing} when you called.", "{name} has already {act.pp} twice this week.",
    "I usually {act.base} on {day} mornings.", "Yesterday I {act.past} and then {act2.past}.",
    "I will {act.base} after I {act2.base}.", "By {day}, we will have {act.pp}.",
    "I have been {act.ing} all afternoon, and I am exhausted.", "{name} {act.past} before {time} today.",
    "Tomorrow {name} is going to {act.base} with {name2}.", "We should {act.base} together sometime.",
    "My {rel} {act.past} while I was at {place}.", "I had never {act.pp} in {city} before.",
    # questions
    "Could you send me the {doc} before {time}?", "Did you remember to {act.base} before you left?",
    "What time does the {transport} to {city} leave?", "How much did you pay for that {color} {clothing}?",
    "Can you pick up some {food} on your way home?", "Do you want {food} or {food2} for dinner tonight?",
    "Where did you put the {obj}?", "Have you ever been to {city} in {month}?",
    "Could you check whether the {site} is working for you?", "What are you doing on {day} evening?",
    "Is there a {shop} near here that is open late?", "How long does it take to get to {city} by {transport}?",
    "Did {name} say whether the {event} is still on?", "Are you free for a quick call at {time}?",
    "Can I pay for the {plural} by card?", "Can you share your screen during the {event}?",
    "Who is picking up {name} from {place} on {day}?", "Has anyone seen my {color} {obj}?",
    "Would you like to join us for {food} on {day}?", "Why did your {rel} move to {city}?",
    "Is it true that {name} is now {job_a}?", "When are you going to {act.base}?",
    # requests and instructions
    "Could you please {please}?", "Would you mind if I opened the window in the {room}?",
    "Please turn off the {appliance} when you leave the {room}.", "Don't forget to {act.base} before {day}.",
    "Please update your {site} password before the end of {month}.", "Remind me to call {name} at {time}.",
    "Let's meet outside {place} at {time}.", "Turn left at the {landmark} and {place} is on your right.",
    "Let me know if you need help with the {doc}.", "Please bring your {obj} to the {event} on {day}.",
    "{name}, could you {please} when you have a minute?", "Take the {transport} to {city} and call me from there.",
    # exclamations
    "Wow, that {dish} smells amazing!", "That was the best {dish} I have ever had!",
    "I can't find my {obj} anywhere!", "Oh no, I think I left the {appliance} on!",
    "Watch out, the floor in the {room} is wet!", "Thanks so much for the {gift}, {name}!",
    "What a lovely {color} {clothing}, {name}!", "Happy birthday, {name}, I hope you have a wonderful day!",
    "Congratulations on the new job in {city}, {name}!", "I cannot believe it is already {month}!",
    # short dialogue lines
    "Hello, this is {name}, I am calling about the {doc}.", "Hi {name}, how was your trip to {city}?",
    "Yes, I can meet you at {place} after {time}.", "No thanks, I already had {food} for lunch.",
    "Sorry I'm late, the {transport} was {delay}.", "Good morning, {name}, did you sleep well?",
    "Honey, have you seen my {obj}?", "Sure, {name}, I will {act.base} later today.",
    "Sorry, {name}, I am busy until {time}.", "Okay, I will text you when I get to {place}.",
]

_SLOT = re.compile(r"\{([a-z_]+?)(\d*)(?:\.\w+)?\}")


def _slots(template: str) -> dict[str, list[str]]:
    """Pool name -> distinct slot names used in the template, e.g. {'name': ['name', 'name2']}."""
    by_pool: dict[str, list[str]] = {}
    for pool, suffix in _SLOT.findall(template):
        names = by_pool.setdefault(pool, [])
        if pool + suffix not in names:
            names.append(pool + suffix)
    return by_pool


def capacity() -> int:
    """Upper bound on the number of distinct sentences the templates can produce."""
    return sum(math.prod(math.perm(len(POOLS[p]), len(n)) for p, n in _slots(t).items()) for t in TEMPLATES)


def _fill(template: str, rng: random.Random) -> str:
    values: dict[str, object] = {}
    for pool, names in _slots(template).items():
        values.update(zip(names, rng.sample(POOLS[pool], len(names))))
    text = template.format(**values)
    return text[0].upper() + text[1:]


def everyday_sentences(count: int, seed: int = 0) -> list[str]:
    """`count` distinct everyday sentences, the same list for the same seed."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if count > capacity():
        raise ValueError(f"cannot produce {count} distinct sentences (at most {capacity()})")
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 50 * count + 100_000:
            raise ValueError(f"only found {len(out)} distinct sentences of the {count} asked for")
        sentence = _fill(rng.choice(TEMPLATES), rng)
        if sentence not in seen and 4 <= len(sentence.split()) <= 18:
            seen.add(sentence)
            out.append(sentence)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=20, help="number of distinct sentences to print")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    print("\n".join(everyday_sentences(a.count, a.seed)))


if __name__ == "__main__":
    main()
