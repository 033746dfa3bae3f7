"""Text normalisation: a table of exact readings (English, Chinese, mixed, tags) plus property tests."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cadenza.errors import InputError, TextError
from cadenza.text import normalize
from cadenza.text.normalize import protected_spans
from cadenza.text.normalize.detect import detect_language
from cadenza.text.qwen_tokenizer import COSYVOICE2_SPECIAL_TOKENS

EN = [
    ("I have 0 apples.", "I have zero apples."),
    ("He is 7 years old.", "He is seven years old."),
    ("There are 13 cats.", "There are thirteen cats."),
    ("She scored 21 points.", "She scored twenty-one points."),
    ("It weighs 101 pounds.", "It weighs one hundred one pounds."),
    ("About 999 people came.", "About nine hundred ninety-nine people came."),
    ("Exactly 1,000 people.", "Exactly one thousand people."),
    ("The city has 1,234,567 residents.",
     "The city has one million two hundred thirty-four thousand five hundred sixty-seven residents."),
    ("The total is 1000000 units.", "The total is one million units."),
    ("Temperature fell to -5 degrees.", "Temperature fell to minus five degrees."),
    ("I'm 6'2\" tall.", "I'm six foot two tall."),
    ("She is 5' 11\" and he is 6'0\".", "She is five foot eleven and he is six foot."),
    ("He's 6’2 now.", "He's six foot two now."),
    ("I write C# and F# on .NET daily.", "I write C sharp and F sharp on dot net daily."),
    ("Use C#.", "Use C sharp."),
    ("The value is -0.75 now.", "The value is minus zero point seven five now."),
    ("Pi is 3.14159.", "Pi is three point one four one five nine."),
    ("Add .5 to it.", "Add point five to it."),
    ("I won 1st place.", "I won first place."),
    ("She came 2nd and he came 3rd.", "She came second and he came third."),
    ("This is the 22nd time.", "This is the twenty-second time."),
    ("The 100th anniversary.", "The one hundredth anniversary."),
    ("Our 11th, 12th and 13th days.", "Our eleventh, twelfth and thirteenth days."),
    ("In 1999 we moved.", "In nineteen ninety-nine we moved."),
    ("Since 2008, prices rose.", "Since two thousand eight, prices rose."),
    ("He was born in 1905.", "He was born in nineteen oh five."),
    ("By 2010 it changed.", "By twenty ten it changed."),
    ("It closed in 1900.", "It closed in nineteen hundred."),
    ("The year 1999 was 20% better than 1998.",
     "The year nineteen ninety-nine was twenty percent better than nineteen ninety-eight."),
    ("About 2024 people came.", "About two thousand twenty-four people came."),
    ("The 1980s were fun.", "The nineteen eighties were fun."),
    ("The '90s were better.", "The nineties were better."),
    ("It costs $5.", "It costs five dollars."),
    ("It costs $1.", "It costs one dollar."),
    ("It costs $0.99.", "It costs ninety-nine cents."),
    ("$1,234.56", "one thousand two hundred thirty-four dollars and fifty-six cents"),
    ("It costs $2.5 million.", "It costs two point five million dollars."),
    ("It costs $3bn.", "It costs three billion dollars."),
    ("It costs $100k.", "It costs one hundred thousand dollars."),
    ("Pay €20 now.", "Pay twenty euros now."),
    ("Pay €1.50 now.", "Pay one euro and fifty cents now."),
    ("That is £3.20 each.", "That is three pounds and twenty pence each."),
    ("It costs ¥500.", "It costs five hundred yen."),
    ("It costs 100 USD.", "It costs one hundred US dollars."),
    ("It costs EUR 50.", "It costs fifty euros."),
    ("It costs 30 GBP.", "It costs thirty pounds."),
    ("It costs 1000 JPY.", "It costs one thousand yen."),
    ("It costs RMB 200.", "It costs two hundred yuan."),
    ("It costs 88 CNY.", "It costs eighty-eight yuan."),
    ("Prices range $10-20.", "Prices range ten to twenty dollars."),
    ("Growth was 3.5%.", "Growth was three point five percent."),
    ("Growth was -2%.", "Growth was minus two percent."),
    ("About 10-20% of people.", "About ten to twenty percent of people."),
    ("The date is 2024-03-15.", "The date is March fifteenth, twenty twenty-four."),
    ("The date is 3/15/2024.", "The date is March fifteenth, twenty twenty-four."),
    ("It happened on March 15, 2024.", "It happened on March fifteenth, twenty twenty-four."),
    ("It happened on Jan. 5th, 2024.", "It happened on January fifth, twenty twenty-four."),
    ("It happened on 4 July 1776.", "It happened on the fourth of July, seventeen seventy-six."),
    ("See you on May 1.", "See you on May first."),
    ("In September 2023 we met.", "In September twenty twenty-three we met."),
    ("Meet at 3:45 pm.", "Meet at three forty-five PM."),
    ("Meet at 10:30am.", "Meet at ten thirty AM."),
    ("Meet at 14:30.", "Meet at fourteen thirty."),
    ("Meet at 9:00.", "Meet at nine o'clock."),
    ("Meet at 9:05.", "Meet at nine oh five."),
    ("Wake up at 7 a.m. Then eat.", "Wake up at seven AM. Then eat."),
    ("Call 555-1234.", "Call five five five, one two three four."),
    ("Call (555) 123-4567.", "Call five five five, one two three, four five six seven."),
    ("Call +1 415 555 2671.", "Call plus one, four one five, five five five, two six seven one."),
    ("Run 5 km.", "Run five kilometers."),
    ("Run 1 km.", "Run one kilometer."),
    # the micro sign (U+00B5, what keyboards type) and the Greek mu (U+03BC) alike
    ("Take 5 \u00b5g, wait 10 \u03bcs, add 2 \u00b5L, 1 mcg.",
     "Take five micrograms, wait ten microseconds, add two microliters, one microgram."),
    ("The \u00b5 sign, 5 \u00b5m.", "The \u03bc sign, five micrometers."),
    ("It is 2.5 mm thick.", "It is two point five millimeters thick."),
    ("He lifted 100 kg.", "He lifted one hundred kilograms."),
    ("Add 500 g of flour.", "Add five hundred grams of flour."),
    ("Take 5 mg daily.", "Take five milligrams daily."),
    ("Pour 250 ml of milk.", "Pour two hundred fifty milliliters of milk."),
    ("Drink 2 L of water.", "Drink two liters of water."),
    ("Drive at 60 km/h.", "Drive at sixty kilometers per hour."),
    ("It is -3°C outside.", "It is minus three degrees Celsius outside."),
    ("It is 98.6°F.", "It is ninety-eight point six degrees Fahrenheit."),
    ("The room is 20 m² in size.", "The room is twenty square meters in size."),
    ("Wait 10 min.", "Wait ten minutes."),
    ("Dr. Smith is here.", "Doctor Smith is here."),
    ("Mr. and Mrs. Brown came.", "Mister and Missus Brown came."),
    ("She lives on Baker St. near the park.", "She lives on Baker Street near the park."),
    ("We visited St. Louis.", "We visited Saint Louis."),
    ("Apples, pears, etc. are fruit.", "Apples, pears, et cetera are fruit."),
    ("Bring fruit, e.g. apples.", "Bring fruit, for example apples."),
    ("One thing, i.e. this.", "One thing, that is this."),
    ("Cats vs. dogs.", "Cats versus dogs."),
    ("Cats Vs. Dogs: Approx. 5 kg. Etc. Etc.", "Cats Versus Dogs: Approximately five kilograms. Et cetera. Et cetera."),
    ("Read Chapter IV now.", "Read Chapter four now."),
    ("See Vol. IV and Vol. 4.", "See Volume four and Volume four."),
    ("Game vs3 today", "Game versus three today"),
    ("Vol.IV, 5C#, e.g.F# and .NET#5", "Volume four, five C sharp, for example F sharp and dot net number five"),
    ("Henry VIII had six wives.", "Henry the eighth had six wives."),
    ("World War II ended in 1945.", "World War two ended in nineteen forty-five."),
    ("Louis XIV was king.", "Louis the fourteenth was king."),
    ("Super Bowl LVIII was close.", "Super Bowl fifty-eight was close."),
    ("I think I can, said I.", "I think I can, said I."),
    ("Class C and Peter MD.", "Class C and Peter MD."),
    ("He is No. 1.", "He is number one."),
    ("Tom & Jerry.", "Tom and Jerry."),
    ("Add 2/3 cup.", "Add two thirds cup."),
    ("Add 1 1/2 cups.", "Add one and one half cups."),
    ("About ½ of them.", "About one half of them."),
    ("Version 1.2.3 is out.", "Version one point two point three is out."),
    ("Compute 2 + 3 = 5.", "Compute two plus three equals five."),
    ("Compute 6 × 7 = 42.", "Compute six times seven equals forty-two."),
    ("It is 2x faster.", "It is two times faster."),
    ("Pages 10-20.", "Pages ten to twenty."),
    ("From 1990-1995 we lived there.", "From nineteen ninety to nineteen ninety-five we lived there."),
    ("COVID-19 spread.", "COVID-nineteen spread."),
    ("Room 42B.", "Room forty-two B."),
    ("Agent 007.", "Agent zero zero seven."),
    ("Write 300-1000 words.", "Write three hundred to one thousand words."),
    ("We met on the 5th of May.", "We met on the fifth of May."),
    ("Due on 12/25.", "Due on December twenty-fifth."),
    ("Jan 2020 was cold.", "January twenty twenty was cold."),
    # emergency and service numbers where they are dialled; elsewhere a number
    ("Call 911 now.", "Call nine one one now."),
    ("In an emergency, dial 999 or 112.", "In an emergency, dial nine nine nine or one one two."),
    ("Make a 911 call.", "Make a nine one one call."),
    ("There were 911 entries.", "There were nine hundred eleven entries."),
    # the 24-hour clock's hour 00
    ("The train leaves at 00:00.", "The train leaves at zero zero hundred."),
    ("The train leaves at 00:30.", "The train leaves at zero zero thirty."),
    ("Open from 0:00 am.", "Open from twelve AM."),
    ("It costs $.50 each.", "It costs fifty cents each."),
    ("The balance is $-5.", "The balance is minus five dollars."),
    ("Due 1 Jan.", "Due the first of January."),
    ("It opened on 1 Jan 2024.", "It opened on the first of January, twenty twenty-four."),
    ("3-2-1 go!", "three two one go!"),
    ("They played 4-4-2.", "They played four four two."),
    ("Call 1-800-FLOWERS today.", "Call one eight hundred FLOWERS today."),
    ("Call 1-800-555-0199.", "Call one, eight hundred, five five five, zero one nine nine."),
    ("Now 2^10 is 1024.", "Now two to the power of ten is one thousand twenty-four."),
    ("Area is x^2, volume x^3, decay 10^-3.", "Area is x squared, volume x cubed, decay ten to the power of minus three."),
    ("\U0001d407\U0001d41e\U0001d425\U0001d425\U0001d428 \U0001d7d0 you", "Hello two you"),  # mathematical bold
    ("It is >5 degrees.", "It is greater than five degrees."),
    ("Only if x < 10 and y > 3.", "Only if x less than ten and y greater than three."),
]

ZH = [
    ("我有0个苹果。", "我有零个苹果。"),
    ("他身高6'2\"。", "他身高六英尺二英寸。"),
    ("他今年7岁。", "他今年七岁。"),
    ("班里有13个学生。", "班里有十三个学生。"),
    ("一共21个人。", "一共二十一个人。"),
    ("他跑了101米。", "他跑了一百零一米。"),
    ("全校有999名学生。", "全校有九百九十九名学生。"),
    ("共有1,234,567人。", "共有一百二十三万四千五百六十七人。"),
    ("人口10050人。", "人口一万零五十人。"),
    ("预算100000001元。", "预算一亿零一元。"),
    ("距离115公里。", "距离一百一十五公里。"),
    ("我有2个苹果。", "我有两个苹果。"),
    ("买了2本书。", "买了两本书。"),
    ("第2名。", "第二名。"),
    ("第2000位顾客。", "第二千位顾客。"),
    ("来了2000人。", "来了两千人。"),
    ("2万人参加。", "两万人参加。"),
    ("2亿元投资。", "两亿元投资。"),
    ("22000人。", "两万二千人。"),
    ("12000元。", "一万二千元。"),
    ("2年级。", "二年级。"),
    ("温度是-5度。", "温度是负五度。"),
    ("数值为-0.75。", "数值为负零点七五。"),
    ("圆周率是3.14159。", "圆周率是三点一四一五九。"),
    ("增长了3.5%。", "增长了百分之三点五。"),
    ("下降了-2%。", "下降了负百分之二。"),
    ("大约10-20%的人。", "大约百分之十到百分之二十的人。"),
    ("2024年3月15日", "二零二四年三月十五日"),
    ("他出生于1998年5月20日。", "他出生于一九九八年五月二十日。"),
    ("2024-03-15发布。", "二零二四年三月十五日发布。"),
    ("会议在3/15/2024举行。", "会议在二零二四年三月十五日举行。"),
    ("３月８日是妇女节。", "三月八日是妇女节。"),
    ("1990年代。", "一九九零年代。"),
    ("２０２４年", "二零二四年"),
    ("下午3:45见。", "下午三点四十五分见。"),
    ("14:30开会。", "十四点三十分开会。"),
    ("9:00上课。", "九点上课。"),
    ("2:05出发。", "两点零五分出发。"),
    ("会议在12:00:30结束。", "会议在十二点零分三十秒结束。"),
    ("我的电话是13800138000。", "我的电话是幺三八零零幺三八零零零。"),
    ("请拨打010-12345678。", "请拨打零幺零，幺二三四五六七八。"),
    ("拨打110报警。", "拨打幺幺零报警。"),
    ("跑了5km。", "跑了五公里。"),
    ("重2.5kg。", "重二点五千克。"),
    ("喝2L水。", "喝两升水。"),
    ("时速60km/h。", "时速六十公里每小时。"),
    ("今天25°C。", "今天二十五摄氏度。"),
    ("气温-3°C。", "气温零下三摄氏度。"),
    ("温度25℃。", "温度二十五摄氏度。"),
    ("面积20m²。", "面积二十平方米。"),
    ("价格是$100。", "价格是一百美元。"),
    ("花了$1,234.56。", "花了一千二百三十四点五六美元。"),
    ("售价¥99。", "售价九十九元。"),
    ("售价￥12.50。", "售价十二点五元。"),
    ("价值€50。", "价值五十欧元。"),
    ("收费100 USD。", "收费一百美元。"),
    ("收入$2.5 million。", "收入二百五十万美元。"),
    ("3/4的人同意。", "四分之三的人同意。"),
    ("½的人。", "二分之一的人。"),
    ("比分是3:2。", "比分是三比二。"),
    ("3+2=5。", "三加二等于五。"),
    ("6×7=42。", "六乘七等于四十二。"),
    ("第1名，第2名，第3名。", "第一名，第二名，第三名。"),
    ("买了 3 本书", "买了三本书"),
    ("共有3~5个。", "共有三到五个。"),
    ("等了2-3天。", "等了两到三天。"),
    ("2020-2024年。", "二零二零到二零二四年。"),
    ("3.5亿元。", "三点五亿元。"),
    ("1.5万人。", "一点五万人。"),
    ("0.5升。", "零点五升。"),
    ("2点钟。", "两点钟。"),
    ("今天是2024年1月5日，气温-3°C。", "今天是二零二四年一月五日，气温零下三摄氏度。"),
    ("550 + 320 = 870 千卡。", "五百五十加三百二十等于八百七十千卡。"),
    ("价格：12.5元（含税）", "价格：十二点五元（含税）"),
    ("写300-1000字。", "写三百到一千字。"),
    ("学号2021001。", "学号二零二幺零零幺。"),
    ("价格>100元。", "价格大于一百元。"),
    ("3-2-1发射！", "三二一发射！"),
    ("2^10是1024。", "二的十次方是一千零二十四。"),
    ("收入$5万。", "收入五万美元。"),
]

MIXED = [
    ("我有3个apple", "我有三个apple"),
    ("I have 3个苹果", "I have 三个苹果"),
    ("价格是 100 USD。", "价格是一百美元。"),
    ("他说 3 times。", "他说 three times。"),
    ("The meeting is at 3点。", "The meeting is at 三点。"),
    ("我们在2024年visited Paris.", "我们在二零二四年visited Paris."),
    ("Apple在2023年卖了2亿部iPhone。", "Apple在二零二三年卖了两亿部iPhone。"),
    ("He paid ¥100 in 北京。", "He paid one hundred yen in 北京。"),
    ("Dr. Smith 说 3 点到。", "Doctor Smith 说三点到。"),
    ("[laughter] 我有3个苹果 [breath]", "[laughter] 我有三个苹果 [breath]"),
    ("<strong>3</strong>个苹果", "<strong>三</strong>个苹果"),
    ("<strong>Dr. Smith</strong> paid $5.", "<strong>Doctor Smith</strong> paid five dollars."),
    ("<laughter>3 times</laughter>", "<laughter>three times</laughter>"),
    ("用四川话说这句话<|endofprompt|>我有2个苹果。", "用四川话说这句话<|endofprompt|>我有两个苹果。"),
    ("(A young woman, 25 years old, gentle voice)Hello, I have 3 cats.",
     "(A young woman, 25 years old, gentle voice)Hello, I have three cats."),
    ("(温柔的女声，30岁)我有2只猫。", "(温柔的女声，30岁)我有两只猫。"),
    ("(1) First item costs $5.", "(one) First item costs five dollars."),
    ("I have 3 cats [sigh] and 2 dogs.", "I have three cats [sigh] and two dogs."),
    ("[quick_breath]2024年[vocalized-noise]", "[quick_breath]二零二四年[vocalized-noise]"),
    ("  trailing space 5   ", "trailing space five"),
    ("emoji 😀 3 apples 🍎", "emoji 😀 three apples 🍎"),
    ("tab\tand\x07 3\r\nlines", "tab and three\nlines"),
    ("", ""),
    ("   ", ""),
    ("１２３ＡＢＣ", "one hundred twenty-three ABC"),
]

FORCED = [
    ("3 apples", "en", "three apples"),
    ("3.5%", "zh", "百分之三点五"),
    ("3.5%", "en", "three point five percent"),
    ("3个苹果", "en", "three个苹果"),
    ("3 apples", "zh", "三 apples"),
    ("Chapter IV, 3 cats", "zh", "Chapter four, 三 cats"),
    ("March 5, 2024 是 2 天", "zh", "March fifth, twenty twenty-four 是两天"),
]


@pytest.mark.parametrize(("text", "expected"), EN + ZH + MIXED)
def test_reading(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize(("text", "lang", "expected"), FORCED)
def test_forced_language(text, lang, expected):
    assert normalize(text, lang) == expected


def test_table_size():
    assert len(EN) >= 75 and len(ZH) + len(MIXED) >= 75


def test_description_switch():
    assert normalize("(Speaker 2, calm)Hi 3", keep_description=False) == "(Speaker two, calm)Hi three"


def test_bad_arguments():
    with pytest.raises(TextError):
        normalize(None)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        normalize("3", lang="fr")


def test_detect_language():
    assert detect_language("今天天气很好 ok") == "zh"
    assert detect_language("Hello there 你") == "en"
    assert detect_language("123。") == "zh" and detect_language("123.") == "en"


def test_text_modules_import_without_torch():
    # cadenza/__init__ imports the torch-based API; load the text package on its own to see what *it* imports.
    code = (
        "import importlib.util, sys, types\n"
        "spec = importlib.util.find_spec('cadenza')\n"
        "pkg = types.ModuleType('cadenza'); pkg.__path__ = list(spec.submodule_search_locations)\n"
        "sys.modules['cadenza'] = pkg\n"
        "import cadenza.text\n"
        "from cadenza.text import normalize, split_text\n"
        "assert normalize('3') == 'three' and split_text('a. b.', 100) == ['a. b.']\n"
        "print(sorted(m for m in ('torch', 'numpy', 'tokenizers', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("base", [
    "I have 3 apples and $5.50 on Jan. 5th, 2024. 今天是2024年1月5日，气温-3°C。Dr. Smith paid 1,234 "
    "dollars for 2.5 kg of rice at 3:45 pm. 我有2个苹果，第2个坏了，2000人，2.5公里。Chapter IV. ",
    "**a __b ~~c ",  # Markdown openers that never close, on one line (was quadratic)
])
def test_normalization_time_grows_linearly_with_the_text(base):
    # A ratio within one run, not a wall-clock bound: a loaded machine slows both lengths alike, while a quadratic
    # pass (a regex that backtracks, a rescan per match) makes ten times the text cost ~100 times as much.

    def fastest(text: str) -> float:
        normalize(text)
        runs = []
        for _ in range(3):
            start = time.perf_counter()
            normalize(text)
            runs.append(time.perf_counter() - start)
        return min(runs)

    text = base * (50000 // len(base) + 1)
    short, long = fastest(text[:5000]), fastest(text[:50000])
    assert long / short < 30, f"5,000 chars {short:.3f} s, 50,000 chars {long:.3f} s"
    assert long < 10, f"50,000 chars took {long:.1f} s"


# ---------------------------------------------------------------- properties

_TAGS = [*COSYVOICE2_SPECIAL_TOKENS, "<|endoftext|>", "[sigh]", "<|custom_tag|>"]
_PIECES = ["3", "12", "2024", "1,000", "3.14", "-5", "$", "€", "%", "km", " ", "年", "个", "Dr.", "Chapter ", "IV",
           "I", "&", "e.g.", ":", "/", "-", ".", "°C", "May ", "No.", "x", "s", "am", "(", ")", "第", "2", "万"]
_ALPHABET = st.characters(codec="ascii") | st.sampled_from("我有个年月日第万亿点元，。！？：、（）【】")
_SUPPORTED = st.lists(st.sampled_from(_PIECES) | st.text(_ALPHABET, max_size=4), max_size=12).map("".join)
_ANY = st.text() | st.lists(st.sampled_from(_PIECES) | st.text(max_size=3), max_size=12).map("".join)
_SETTINGS = settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _outside(text: str) -> str:
    spans = protected_spans(text)
    keep, pos = [], 0
    for a, b in spans:
        keep.append(text[pos:a])
        pos = b
    return "".join(keep) + text[pos:]


@_SETTINGS
@given(_SUPPORTED)
def test_no_ascii_digit_survives(text):
    assert not re.search(r"[0-9]", _outside(normalize(text)))


@_SETTINGS
@given(_ANY)
@example("vs0")  # found by this test in CI: spelt "vs zero", which a second pass read "versus zero"
@example("Vol. I.e.")  # "Vol. one" -> "Volume one" on a second pass
@example("vs&")
@example("e.g.F#")
@example("5C#")
@example(".NET#5")
@example("Vol.IV")
def test_idempotent_and_never_raises(text):
    once = normalize(text)
    assert normalize(once) == once


@_SETTINGS
@given(st.lists(st.tuples(_SUPPORTED, st.sampled_from(_TAGS)), min_size=1, max_size=6), _SUPPORTED)
def test_tags_pass_byte_for_byte(parts, tail):
    text = "".join(a + t for a, t in parts) + tail
    out = normalize(text)
    rest = iter(m.group() for m in re.finditer("|".join(re.escape(t) for t in sorted(set(_TAGS), key=len,
                                                                                      reverse=True)), out))
    assert all(any(found == t for found in rest) for _, t in parts)  # every tag, in order, unchanged
