"""Seeded, versioned generator of GSM8K-format word problems.

Each problem is a dict {"question", "answer"} exactly like openai/gsm8k: the answer is a few
reasoning lines with calculator annotations (`12*28=<<12*28=336>>336`) and a final `#### N`,
so lm-eval's `gsm8k` task (prompt, stop strings, strict-match regex) applies unchanged.

Problem i of a split is a pure function of (version, split, i): its RNG is seeded with a
string, which Python hashes with SHA-512, so files are byte-identical on every machine and
the training stream can be generated in parallel chunks.

Splits are disjoint by `twin_key` (the numbers of the question and its final answer), not by
text: v1 compared whole texts, so a test question that differed from a training one only in a
name or an item had its memorized answer in training (296 of v1's 1000 test questions). v2 draws
with its own seeds and excludes such twins; v1 draws remain for the tokenizer's corpus.

Difficulty is set for a ~5M-parameter model with one token per digit: a product is a 2-digit
number times 2..12 or a 3-4 digit number times 2..9, divisions are exact with a divisor 2..12,
sums and differences use up to 4-digit numbers, and no value is ever negative or fractional.

    python models/recipes/synth_gsm8k.py            # write models/data/synth-gsm8k-v2/
    python models/recipes/synth_gsm8k.py --check    # verify the shipped files
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

VERSION = "v2"
# Every version draws from the same templates; only the seed string differs.
VERSIONS = ("v1", "v2")
DATA_DIR = Path(__file__).resolve().parents[1] / "data" / f"synth-gsm8k-{VERSION}"
SPLIT_SIZES = {"test": 1000, "train": 2000}
# Training-stream problems longer than this are dropped so that any 5 train examples plus a
# test question and its answer fit in 1024 tokens (one token per digit or symbol at worst).
MAX_PROBLEM_CHARS = 400

Problem = dict[str, str]

NAMES = [
    "Ava", "Ben", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Liam",
    "Maya", "Nico", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Wes", "Yuki", "Zane",
]
OPS: dict[str, Callable[[int, int], int]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,
}


class Work:
    """Collects the answer lines; every line shows one calculator step."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, a: int, op: str, b: int, sentence: str) -> int:
        value = OPS[op](a, b)
        if value < 0 or (op == "/" and a % b):
            raise AssertionError(f"bad step {a}{op}{b}")  # a template bug, never user input
        expr = f"{a}{op}{b}"
        self.lines.append(sentence.format(calc=f"{expr}=<<{expr}={value}>>{value}"))
        return value

    def answer(self, final: int) -> str:
        return "\n".join([*self.lines, f"#### {final}"])


def _mul_factor(r: random.Random) -> int:
    return r.randint(2, 12)


def _price(r: random.Random) -> int:
    return r.randint(3, 99)


def _divisible(r: random.Random, divisor: int, lo: int = 3, hi: int = 99) -> int:
    return divisor * r.randint(lo, hi)


# Each template: rng -> (question, answer). Optional clauses give one to four steps.


def t_shopping(r: random.Random) -> tuple[str, str]:
    n, item, w = r.choice(NAMES), r.choice(["notebooks", "pens", "mugs", "towels", "candles", "plates"]), Work()
    k, p = _mul_factor(r), _price(r)
    q = f"{n} buys {k} {item} that cost {p} dollars each."
    total = w.step(k, "*", p, f"The {item} cost {{calc}} dollars.")
    if r.random() < 0.6:
        fee = r.randint(5, 60)
        q += f" Delivery costs {fee} dollars."
        total = w.step(total, "+", fee, f"With delivery {n} pays {{calc}} dollars.")
    if r.random() < 0.5:
        budget = total + r.randint(10, 900)
        q += f" {n} had {budget} dollars. How many dollars does {n} have left?"
        return q, w.answer(w.step(budget, "-", total, f"{n} has {{calc}} dollars left."))
    return q + f" How many dollars does {n} spend?", w.answer(total)


def t_baking(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    trays, per = _mul_factor(r), r.randint(6, 48)
    q = f"{n} bakes {trays} trays of cookies with {per} cookies on each tray."
    total = w.step(trays, "*", per, f"{n} bakes {{calc}} cookies.")
    if r.random() < 0.6:
        eaten = r.randint(2, min(total - 1, 40))
        q += f" The family eats {eaten} cookies."
        total = w.step(total, "-", eaten, f"There are {{calc}} cookies left.")
    if r.random() < 0.5:
        box = r.choice([d for d in range(2, 13) if total % d == 0] or [1])
        if box > 1:
            q += f" {n} packs the rest into boxes of {box}. How many boxes does {n} fill?"
            return q, w.answer(w.step(total, "/", box, f"{n} fills {{calc}} boxes."))
    return q + " How many cookies are there now?", w.answer(total)


def t_savings(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    weekly, weeks, start = r.randint(5, 95), _mul_factor(r), r.randint(20, 900)
    q = f"{n} has {start} dollars and saves {weekly} dollars every week for {weeks} weeks."
    saved = w.step(weekly, "*", weeks, f"{n} saves {{calc}} dollars.")
    total = w.step(start, "+", saved, f"{n} then has {{calc}} dollars.")
    if r.random() < 0.5:
        gift = r.randint(10, 300)
        q += f" Then {n} gets a gift of {gift} dollars."
        total = w.step(total, "+", gift, f"After the gift {n} has {{calc}} dollars.")
    if r.random() < 0.5:
        bike = r.randint(20, total - 1)
        q += f" {n} buys a bike for {bike} dollars."
        total = w.step(total, "-", bike, f"After buying the bike {n} has {{calc}} dollars.")
    return q + f" How many dollars does {n} have in the end?", w.answer(total)


def t_travel(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    speed, hours = r.randint(15, 95), _mul_factor(r)
    q = f"{n} drives at {speed} miles per hour for {hours} hours."
    dist = w.step(speed, "*", hours, f"{n} drives {{calc}} miles.")
    if r.random() < 0.6:
        extra = r.randint(10, 400)
        q += f" Then {n} drives another {extra} miles."
        dist = w.step(dist, "+", extra, f"In total {n} drives {{calc}} miles.")
    if r.random() < 0.4:
        trip = dist + r.randint(20, 1500)
        q += f" The whole trip is {trip} miles. How many miles are left?"
        return q, w.answer(w.step(trip, "-", dist, f"{{calc}} miles are left."))
    return q + f" How many miles does {n} drive?", w.answer(dist)


def t_garden(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    rows, per = _mul_factor(r), r.randint(4, 60)
    q = f"{n} plants {rows} rows of tulips with {per} tulips in each row."
    tulips = w.step(rows, "*", per, f"There are {{calc}} tulips.")
    roses = r.randint(10, 500)
    q += f" {n} also plants {roses} roses."
    total = w.step(tulips, "+", roses, f"{n} plants {{calc}} flowers.")
    if r.random() < 0.4:
        daisies = r.randint(10, 300)
        q += f" A neighbor gives {n} {daisies} daisies to plant."
        total = w.step(total, "+", daisies, f"With the daisies there are {{calc}} flowers.")
    if r.random() < 0.4:
        dead = r.randint(3, min(total - 1, 90))
        q += f" Then {dead} flowers die. How many flowers are left?"
        return q, w.answer(w.step(total, "-", dead, f"{{calc}} flowers are left."))
    return q + " How many flowers does the garden have?", w.answer(total)


def t_library(r: random.Random) -> tuple[str, str]:
    w = Work()
    shelves, per, start = _mul_factor(r), r.randint(10, 99), r.randint(100, 3000)
    q = f"A library has {start} books. It buys {shelves} shelves with {per} books on each shelf."
    new = w.step(shelves, "*", per, f"The library buys {{calc}} books.")
    total = w.step(start, "+", new, f"Now it has {{calc}} books.")
    if r.random() < 0.5:
        gift = r.randint(5, 300)
        q += f" A school donates {gift} books."
        total = w.step(total, "+", gift, f"After the donation it has {{calc}} books.")
    if r.random() < 0.5:
        lent = r.randint(10, min(total - 1, 800))
        q += f" Then it lends out {lent} books. How many books are on the shelves now?"
        return q, w.answer(w.step(total, "-", lent, f"{{calc}} books are on the shelves."))
    return q + " How many books does it have now?", w.answer(total)


def t_sharing(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    friends = _mul_factor(r)
    candies = _divisible(r, friends, 5, 90)
    q = f"{n} shares {candies} candies equally among {friends} friends."
    each = w.step(candies, "/", friends, f"Each friend gets {{calc}} candies.")
    if r.random() < 0.6:
        more = r.randint(2, 60)
        q += f" One friend buys {more} more candies. How many candies does that friend have?"
        return q, w.answer(w.step(each, "+", more, f"That friend has {{calc}} candies."))
    return q + " How many candies does each friend get?", w.answer(each)


def t_school(r: random.Random) -> tuple[str, str]:
    w = Work()
    classes, per = _mul_factor(r), r.randint(15, 40)
    q = f"A school has {classes} classes with {per} students in each class."
    students = w.step(classes, "*", per, f"The school has {{calc}} students.")
    if r.random() < 0.5:
        new = r.randint(5, 200)
        q += f" Then {new} new students join."
        students = w.step(students, "+", new, f"Now there are {{calc}} students.")
    if r.random() < 0.5:
        bus = r.choice([d for d in range(2, 13) if students % d == 0] or [1])
        if bus > 1:
            q += f" The students go on a trip in {bus} equal buses. How many students ride in each bus?"
            return q, w.answer(w.step(students, "/", bus, f"Each bus carries {{calc}} students."))
    return q + " How many students are there?", w.answer(students)


def t_farm(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    hens, eggs, days = r.randint(3, 60), r.randint(2, 6), r.randint(2, 7)
    q = f"{n} has {hens} hens. Each hen lays {eggs} eggs a week."
    weekly = w.step(hens, "*", eggs, f"The hens lay {{calc}} eggs a week.")
    if r.random() < 0.5:
        q += f" How many eggs do they lay in {days} weeks?"
        return q, w.answer(w.step(weekly, "*", days, f"In {days} weeks they lay {{calc}} eggs."))
    sold = r.randint(1, weekly - 1)
    q += f" {n} sells {sold} eggs each week. How many eggs does {n} keep each week?"
    return q, w.answer(w.step(weekly, "-", sold, f"{n} keeps {{calc}} eggs."))


def t_fuel(r: random.Random) -> tuple[str, str]:
    w = Work()
    per_gal, gallons, price = r.randint(12, 45), _mul_factor(r), r.randint(2, 9)
    q = f"A car goes {per_gal} miles on one gallon. The tank holds {gallons} gallons."
    miles = w.step(per_gal, "*", gallons, f"A full tank lasts {{calc}} miles.")
    if r.random() < 0.5:
        q += f" Gas costs {price} dollars a gallon. How many dollars does it cost to fill the tank?"
        return q, w.answer(w.step(gallons, "*", price, f"Filling the tank costs {{calc}} dollars."))
    driven = r.randint(5, miles - 1)
    q += f" The car has gone {driven} miles on a full tank. How many more miles can it go?"
    return q, w.answer(w.step(miles, "-", driven, f"It can go {{calc}} more miles."))


def t_concert(r: random.Random) -> tuple[str, str]:
    w = Work()
    adults, kids = r.randint(20, 600), r.randint(10, 400)
    pa, pk = r.randint(5, 9), r.randint(2, 4)
    q = f"A concert sells {adults} adult tickets for {pa} dollars and {kids} child tickets for {pk} dollars."
    a = w.step(adults, "*", pa, f"Adult tickets bring {{calc}} dollars.")
    k = w.step(kids, "*", pk, f"Child tickets bring {{calc}} dollars.")
    total = w.step(a, "+", k, f"The concert earns {{calc}} dollars.")
    if r.random() < 0.3:
        cost = r.randint(50, total - 1)
        q += f" The band is paid {cost} dollars. How many dollars are left?"
        return q, w.answer(w.step(total, "-", cost, f"{{calc}} dollars are left."))
    return q + " How many dollars does the concert earn?", w.answer(total)


def t_reading(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    pages_day, days = r.randint(5, 60), _mul_factor(r)
    q = f"{n} reads {pages_day} pages a day for {days} days."
    read = w.step(pages_day, "*", days, f"{n} reads {{calc}} pages.")
    book = read + r.randint(10, 900)
    q += f" The book has {book} pages. How many pages are left to read?"
    return q, w.answer(w.step(book, "-", read, f"{{calc}} pages are left."))


def t_bakery_sales(r: random.Random) -> tuple[str, str]:
    w = Work()
    morning, afternoon, price = r.randint(20, 400), r.randint(20, 400), r.randint(2, 9)
    q = f"A bakery sells {morning} muffins in the morning and {afternoon} in the afternoon."
    total = w.step(morning, "+", afternoon, f"It sells {{calc}} muffins.")
    if r.random() < 0.6:
        q += f" Each muffin costs {price} dollars. How many dollars does the bakery make?"
        return q, w.answer(w.step(total, "*", price, f"It makes {{calc}} dollars."))
    return q + " How many muffins does it sell?", w.answer(total)


def t_paint(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    walls, per_wall, cost = _mul_factor(r), r.randint(2, 9), r.randint(3, 12)
    q = f"{n} paints {walls} walls. Each wall needs {per_wall} liters of paint. A liter costs {cost} dollars."
    liters = w.step(walls, "*", per_wall, f"{n} needs {{calc}} liters.")
    total = w.step(liters, "*", cost, f"The paint costs {{calc}} dollars.")
    if r.random() < 0.4:
        brush = r.randint(3, 50)
        q += f" Brushes cost {brush} dollars. How many dollars does {n} spend?"
        return q, w.answer(w.step(total, "+", brush, f"{n} spends {{calc}} dollars."))
    return q + " How many dollars does the paint cost?", w.answer(total)


def t_salary(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    rate, hours = r.randint(9, 60), r.randint(2, 12)
    q = f"{n} earns {rate} dollars an hour and works {hours} hours on Monday."
    pay = w.step(rate, "*", hours, f"On Monday {n} earns {{calc}} dollars.")
    if r.random() < 0.6:
        bonus = r.randint(10, 250)
        q += f" {n} also gets a bonus of {bonus} dollars."
        pay = w.step(pay, "+", bonus, f"With the bonus {n} earns {{calc}} dollars.")
    if r.random() < 0.4:
        rent = r.randint(5, pay - 1)
        q += f" {n} pays {rent} dollars for lunch. How many dollars does {n} keep?"
        return q, w.answer(w.step(pay, "-", rent, f"{n} keeps {{calc}} dollars."))
    return q + f" How many dollars does {n} earn?", w.answer(pay)


def t_party(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    guests, slices = r.randint(4, 60), r.randint(2, 4)
    per_pizza = r.choice([6, 8, 10, 12])
    q = f"{n} invites {guests} guests. Each guest eats {slices} slices of pizza."
    total = w.step(guests, "*", slices, f"The guests eat {{calc}} slices.")
    if total % per_pizza == 0:
        q += f" A pizza has {per_pizza} slices. How many pizzas does {n} need?"
        return q, w.answer(w.step(total, "/", per_pizza, f"{n} needs {{calc}} pizzas."))
    extra = r.randint(2, 30)
    q += f" {n} eats {extra} slices too. How many slices are eaten?"
    return q, w.answer(w.step(total, "+", extra, f"{{calc}} slices are eaten."))


def t_warehouse(r: random.Random) -> tuple[str, str]:
    w = Work()
    trucks, per = _mul_factor(r), r.randint(10, 99)
    stock = trucks * per + r.randint(50, 4000)
    q = f"A warehouse has {stock} boxes. {trucks} trucks each take away {per} boxes."
    taken = w.step(trucks, "*", per, f"The trucks take {{calc}} boxes.")
    left = w.step(stock, "-", taken, f"{{calc}} boxes are left.")
    if r.random() < 0.4:
        delivery = r.randint(50, 900)
        q += f" Then {delivery} boxes arrive. How many boxes are in the warehouse?"
        return q, w.answer(w.step(left, "+", delivery, f"The warehouse has {{calc}} boxes."))
    return q + " How many boxes are left?", w.answer(left)


def t_running(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    laps, meters = r.randint(2, 9), r.choice([200, 250, 300, 400, 500])
    q = f"{n} runs {laps} laps of a {meters} meter track."
    dist = w.step(laps, "*", meters, f"{n} runs {{calc}} meters.")
    if r.random() < 0.5:
        walk = r.randint(100, 2000)
        q += f" Then {n} walks {walk} meters. How many meters does {n} cover in all?"
        return q, w.answer(w.step(dist, "+", walk, f"{n} covers {{calc}} meters."))
    return q + f" How many meters does {n} run?", w.answer(dist)


def t_orchard(r: random.Random) -> tuple[str, str]:
    w = Work()
    trees, apples = r.randint(5, 90), r.randint(2, 12)
    q = f"An orchard has {trees} trees. Each tree gives {apples} baskets of apples."
    baskets = w.step(trees, "*", apples, f"The orchard gives {{calc}} baskets.")
    if r.random() < 0.5:
        sold = r.randint(1, baskets - 1)
        q += f" The farmer sells {sold} baskets."
        baskets = w.step(baskets, "-", sold, f"{{calc}} baskets are left.")
    if r.random() < 0.4:
        price = r.randint(2, 9)
        q += f" Each basket is worth {price} dollars. How many dollars are the baskets worth?"
        return q, w.answer(w.step(baskets, "*", price, f"They are worth {{calc}} dollars."))
    return q + " How many baskets are there?", w.answer(baskets)


def t_aquarium(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    tanks = _mul_factor(r)
    fish = _divisible(r, tanks, 2, 40)
    q = f"{n} has {fish} fish in {tanks} tanks, the same number in each tank."
    per = w.step(fish, "/", tanks, f"Each tank has {{calc}} fish.")
    if r.random() < 0.6:
        added = r.randint(2, 50)
        q += f" {n} adds {added} fish to one tank. How many fish are in that tank?"
        return q, w.answer(w.step(per, "+", added, f"That tank has {{calc}} fish."))
    return q + " How many fish are in each tank?", w.answer(per)


def t_stamps(r: random.Random) -> tuple[str, str]:
    (a, b), w = r.sample(NAMES, 2), Work()
    sa = r.randint(20, 900)
    times = r.randint(2, 6)
    q = f"{a} has {sa} stamps. {b} has {times} times as many stamps as {a}."
    sb = w.step(sa, "*", times, f"{b} has {{calc}} stamps.")
    if r.random() < 0.6:
        q += f" How many stamps do they have together?"
        return q, w.answer(w.step(sa, "+", sb, f"Together they have {{calc}} stamps."))
    return q + f" How many stamps does {b} have?", w.answer(sb)


def t_juice(r: random.Random) -> tuple[str, str]:
    w = Work()
    bottles, ml = r.randint(2, 9), r.choice([150, 200, 250, 300, 330, 500])
    q = f"A shop fills {bottles} bottles with {ml} milliliters of juice each."
    used = w.step(bottles, "*", ml, f"The bottles hold {{calc}} milliliters.")
    vat = used + r.randint(100, 4000)
    q += f" The shop had {vat} milliliters of juice. How many milliliters are left?"
    return q, w.answer(w.step(vat, "-", used, f"{{calc}} milliliters are left."))


def t_toys(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    cars, dolls, balls = r.randint(10, 300), r.randint(10, 300), r.randint(10, 300)
    q = f"A toy store has {cars} cars, {dolls} dolls and {balls} balls."
    s = w.step(cars, "+", dolls, f"Cars and dolls make {{calc}} toys.")
    total = w.step(s, "+", balls, f"The store has {{calc}} toys.")
    if r.random() < 0.5:
        sold = r.randint(5, total - 1)
        q += f" {n} buys {sold} toys. How many toys are left?"
        return q, w.answer(w.step(total, "-", sold, f"{{calc}} toys are left."))
    return q + " How many toys does it have?", w.answer(total)


def t_bus(r: random.Random) -> tuple[str, str]:
    w = Work()
    start = r.randint(5, 60)
    on1 = r.randint(3, 40)
    q = f"A bus has {start} people. At the first stop {on1} people get on."
    count = w.step(start, "+", on1, f"After the first stop there are {{calc}} people.")
    off1 = r.randint(1, count - 1)
    q += f" At the second stop {off1} people get off."
    count = w.step(count, "-", off1, f"After the second stop there are {{calc}} people.")
    if r.random() < 0.5:
        fare = r.randint(2, 9)
        q += f" Each person pays a fare of {fare} dollars. How many dollars do they pay?"
        return q, w.answer(w.step(count, "*", fare, f"They pay {{calc}} dollars."))
    return q + " How many people are on the bus now?", w.answer(count)


def t_recipe(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    grams, batches = r.randint(50, 450), r.randint(2, 9)
    q = f"A cake needs {grams} grams of flour. {n} bakes {batches} cakes."
    need = w.step(grams, "*", batches, f"{n} needs {{calc}} grams of flour.")
    bag = need + r.randint(100, 3000)
    q += f" {n} has a {bag} gram bag of flour. How many grams are left?"
    return q, w.answer(w.step(bag, "-", need, f"{{calc}} grams are left."))


def t_tiles(r: random.Random) -> tuple[str, str]:
    w = Work()
    length, width = r.randint(3, 40), _mul_factor(r)
    q = f"A floor is {length} feet long and {width} feet wide."
    area = w.step(length, "*", width, f"The floor is {{calc}} square feet.")
    price = r.randint(2, 9)
    q += f" Tiles cost {price} dollars per square foot."
    cost = w.step(area, "*", price, f"The tiles cost {{calc}} dollars.")
    if r.random() < 0.4:
        labor = r.randint(50, 800)
        q += f" The worker charges {labor} dollars. How many dollars does the floor cost?"
        return q, w.answer(w.step(cost, "+", labor, f"The floor costs {{calc}} dollars."))
    return q + " How many dollars do the tiles cost?", w.answer(cost)


def t_phone(r: random.Random) -> tuple[str, str]:
    n, w = r.choice(NAMES), Work()
    monthly, months, phone = r.randint(10, 80), _mul_factor(r), r.randint(100, 1500)
    q = f"{n} buys a phone for {phone} dollars and pays {monthly} dollars a month for {months} months."
    plan = w.step(monthly, "*", months, f"The plan costs {{calc}} dollars.")
    total = w.step(phone, "+", plan, f"{n} pays {{calc}} dollars in all.")
    return q + f" How many dollars does {n} pay in all?", w.answer(total)


def t_marbles(r: random.Random) -> tuple[str, str]:
    (a, b), w = r.sample(NAMES, 2), Work()
    start = r.randint(50, 999)
    gave = r.randint(5, start - 1)
    q = f"{a} has {start} marbles and gives {gave} to {b}."
    left = w.step(start, "-", gave, f"{a} has {{calc}} marbles left.")
    if r.random() < 0.5:
        bags = r.choice([d for d in range(2, 13) if left % d == 0] or [1])
        if bags > 1:
            q += f" {a} puts the rest into {bags} equal bags. How many marbles are in each bag?"
            return q, w.answer(w.step(left, "/", bags, f"Each bag has {{calc}} marbles."))
    found = r.randint(5, 400)
    q += f" Then {a} finds {found} more. How many marbles does {a} have now?"
    return q, w.answer(w.step(left, "+", found, f"{a} has {{calc}} marbles now."))


def t_vacation(r: random.Random) -> tuple[str, str]:
    w = Work()
    people, ticket, nights, hotel = r.randint(2, 6), r.randint(20, 300), r.randint(2, 9), r.randint(40, 250)
    q = (f"A family of {people} flies for {ticket} dollars a ticket and stays {nights} nights "
         f"in a hotel that costs {hotel} dollars a night.")
    flights = w.step(people, "*", ticket, f"The flights cost {{calc}} dollars.")
    stay = w.step(nights, "*", hotel, f"The hotel costs {{calc}} dollars.")
    total = w.step(flights, "+", stay, f"The trip costs {{calc}} dollars.")
    if r.random() < 0.6:
        budget = total + r.randint(20, 2000)
        q += f" They saved {budget} dollars. How many dollars are left after the trip?"
        return q, w.answer(w.step(budget, "-", total, f"{{calc}} dollars are left."))
    return q + " How many dollars does the trip cost?", w.answer(total)


TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    t_shopping, t_baking, t_savings, t_travel, t_garden, t_library, t_sharing, t_school, t_farm, t_fuel,
    t_concert, t_reading, t_bakery_sales, t_paint, t_salary, t_party, t_warehouse, t_running, t_orchard,
    t_aquarium, t_stamps, t_juice, t_toys, t_bus, t_recipe, t_tiles, t_phone, t_marbles, t_vacation,
]


def problem(version: str, split: str, index: int) -> Problem:
    """Problem `index` of `split`: a pure function of its arguments (the RNG is seeded by string)."""
    if version not in VERSIONS:
        raise ValueError(f"unknown data version {version!r}; this generator draws {', '.join(VERSIONS)}")
    r = random.Random(f"synth-gsm8k/{version}/{split}/{index}")
    while True:
        question, answer = r.choice(TEMPLATES)(r)
        if len(question) + len(answer) <= MAX_PROBLEM_CHARS:
            return {"question": question, "answer": answer}


_NUMBER = re.compile(r"\d+")


def twin_key(p: Problem) -> str:
    """What a memorized answer depends on: the question's numbers in order and the final answer.

    Two problems with equal keys differ at most in names, items or template wording, so a model
    trained on one has seen the other's answer. The same numbers in another order are another
    problem (its steps differ), as GSM8K's own splits share arithmetic facts."""
    return ",".join(_NUMBER.findall(p["question"])) + "|" + p["answer"].rsplit("#### ", 1)[1]


def problems(split: str, start: int = 0, exclude: frozenset[str] = frozenset(), version: str = VERSION) -> Iterator[Problem]:
    """Problems of `split` from index `start` on, skipping those whose `twin_key` is in `exclude`."""
    index = start
    while True:
        p = problem(version, split, index)
        index += 1
        if twin_key(p) not in exclude:
            yield p


def make_splits() -> dict[str, list[Problem]]:
    """Test first, then train; no two problems of the splits share a `twin_key`."""
    out: dict[str, list[Problem]] = {}
    seen: set[str] = set()
    for split in ("test", "train"):
        rows: list[Problem] = []
        for p in problems(split):
            if twin_key(p) in seen:
                continue
            seen.add(twin_key(p))
            rows.append(p)
            if len(rows) == SPLIT_SIZES[split]:
                break
        out[split] = rows
    return out


def to_jsonl(rows: list[Problem]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=True) + "\n" for row in rows).encode()


def read_jsonl(path: Path) -> list[Problem]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR, help="output folder (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="verify the files in --out instead of writing them")
    args = parser.parse_args(argv)
    splits = make_splits()
    bad = []
    for split, rows in splits.items():
        path = args.out / f"{split}.jsonl"
        data = to_jsonl(rows)
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                bad.append(str(path))
            continue
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"wrote {path} ({len(rows)} problems, sha256 {hashlib.sha256(data).hexdigest()})")
    if bad:
        print(f"error: {', '.join(bad)} differ from generator {VERSION}; regenerate with "
              f"`python models/recipes/synth_gsm8k.py --out {args.out}`", file=sys.stderr)
        return 1
    if args.check:
        print(f"ok: {args.out} matches generator {VERSION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
