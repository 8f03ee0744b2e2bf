"""Issue 30 item 1: the junk filter (ingest.junk.is_junk) keeps every language in every script - also
those written without spaces, OCR that runs words together, formulas, tables and URL-rich references -
and still keeps out base64 and data: URIs, hex dumps and binary read as text. The multilingual corpus is
the Unicode CLDR data that Babel ships: each locale's names of languages, territories, months and days."""
from __future__ import annotations

import base64
import random
import re
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from babel import Locale
from babel.core import get_global, parse_locale
from babel.localedata import locale_identifiers

from conftest import run
from ingest.chunk import ChunkSpec, section_chunks
from ingest.loaders import Page
from ingest.model_ref import resolve_model
from ingest.junk import is_junk
from ingest.sections import Doc, Outline, page_sections

MODEL = resolve_model("default")
SPEC = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30, 48, True)
NULL = '[model]\nbackend = "null"\n'
PLACEHOLDER = re.compile(r"M\d\d$")

CHINESE_PAPER = """基于改进YOLOv5的复杂场景目标检测算法研究

摘要：针对传统目标检测方法在复杂场景下存在的小目标漏检率高、定位精度低等问题，本文提出一种基于改进YOLOv5的目标检测算法。\
首先，在主干网络中引入CBAM注意力机制，增强网络对关键特征的提取能力；其次，采用加权双向特征金字塔网络（BiFPN）实现多尺度特征的\
高效融合；最后，使用SIoU损失函数替代原有的CIoU损失函数，提高边界框回归的精度与收敛速度。在PASCALVOC2012和MSCOCO2017数据集上的\
实验结果表明，改进算法的mAP@0.5分别达到86.3%和58.7%，较原算法分别提高4.2和3.1个百分点，检测速度达到62帧/秒，满足实时检测的要求。

关键词：目标检测；YOLOv5；注意力机制；特征融合；损失函数；深度学习

中图分类号：TP391.41　　文献标志码：A　　文章编号：1001-3695（2022）05-1234-06

基金项目：国家自然科学基金资助项目（62073123，61873086）；湖南省自然科学基金资助项目（2021JJ30456）；湖南省教育厅科学研究\
重点项目（20A123）

作者简介：张伟（1985—），男，湖南长沙人，副教授，博士，主要研究方向为计算机视觉与模式识别（zhangwei@hnu.edu.cn）；李娜\
（1990—），女，硕士研究生，主要研究方向为深度学习。收稿日期：2021-10-12；修回日期：2021-12-03；doi:10.19734/j.issn.1001-3695.2021.10.0456
"""
CLASSICAL_CHINESE = """桃花源记

晋太元中，武陵人捕鱼为业。缘溪行，忘路之远近。忽逢桃花林，夹岸数百步，中无杂树，芳草鲜美，落英缤纷。渔人甚异之。复前行，欲穷其林。

林尽水源，便得一山，山有小口，仿佛若有光。便舍船，从口入。初极狭，才通人。复行数十步，豁然开朗。土地平旷，屋舍俨然，有良田、美池、\
桑竹之属。阡陌交通，鸡犬相闻。其中往来种作，男女衣着，悉如外人。黄发垂髫，并怡然自乐。

见渔人，乃大惊，问所从来。具答之。便要还家，设酒杀鸡作食。村中闻有此人，咸来问讯。自云先世避秦时乱，率妻子邑人来此绝境，不复出焉，\
遂与外人间隔。问今是何世，乃不知有汉，无论魏晋。此人一一为具言所闻，皆叹惋。余人各复延至其家，皆出酒食。停数日，辞去。此中人语云：\
“不足为外人道也。”

既出，得其船，便扶向路，处处志之。及郡下，诣太守，说如此。太守即遣人随其往，寻向所志，遂迷，不复得路。南阳刘子骥，高尚士也，闻之，\
欣然规往。未果，寻病终。后遂无问津者。

子曰：「學而時習之，不亦說乎？有朋自遠方來，不亦樂乎？人不知而不慍，不亦君子乎？」有子曰：「其為人也孝弟，而好犯上者，鮮矣；不好犯上，\
而好作亂者，未之有也。君子務本，本立而道生。孝弟也者，其為仁之本與！」
"""
# The Universal Declaration's article 1 (and a Japanese preamble): scripts that write no spaces between words
UDHR = {
    "Chinese": "人人生而自由，在尊严和权利上一律平等。他们赋有理性和良心，并应以兄弟关系的精神相对待。",
    "Cantonese": "人人生而自由，喺尊嚴同權利上一律平等。佢哋有理性同良心，而且應該用兄弟關係嘅精神相對待。",
    "Japanese": "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。人間は、理性と良心とを"
                "授けられており、互いに同胞の精神をもって行動しなければならない。日本国民は、正当に選挙された国会における代表者を"
                "通じて行動し、われらとわれらの子孫のために、諸国民との協和による成果と、わが国全土にわたつて自由のもたらす恵沢を確保し、"
                "政府の行為によつて再び戦争の惨禍が起ることのないやうにすることを決意し、ここに主権が国民に存することを宣言し、"
                "この憲法を確定する。",
    "Thai": "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักดิ์และสิทธิ ต่างในตนมีเหตุผลและมโนธรรม "
            "และควรปฏิบัติต่อกันด้วยเจตนารมณ์แห่งภราดรภาพ",
    "Lao": "ມະນຸດທັງຫຼາຍເກີດມາມີອິດສະລະແລະສະເໝີພາບກັນໃນດ້ານກຽດຕິສັກແລະສິດທິ ມະນຸດມີເຫດຜົນແລະຄວາມສຳນຶກຜິດຊອບ"
           "ແລະຄວນປະພຶດຕໍ່ກັນດ້ວຍຈິດໃຈພີ່ນ້ອງ",
    "Khmer": "មនុស្សទាំងអស់កើតមកមានសេរីភាពនិងសមភាពក្នុងផ្នែកសេចក្ដីថ្លៃថ្នូរនិងសិទ្ធិ។ មនុស្សមានវិចារណញ្ញាណនិង"
             "សតិសម្បជញ្ញៈជាប់ពីកំណើតហើយគប្បីប្រព្រឹត្ដចំពោះគ្នាទៅវិញទៅមកក្នុងស្មារតីភាតរភាពជាបងប្អូន។",
    "Myanmar": "လူတိုင်းသည်တူညီလွတ်လပ်သောဂုဏ်သိက္ခာဖြင့်လည်းကောင်း၊တူညီလွတ်လပ်သောအခွင့်အရေးများဖြင့်လည်းကောင်း၊"
               "မွေးဖွားလာသူများဖြစ်သည်။ထိုသူတို့၌ပိုင်းခြားဝေဖန်နိုင်သောဉာဏ်နှင့်ကျင့်ဝတ်သိတတ်သောစိတ်ရှိကြ၍"
               "ထိုသူတို့သည်အချင်းချင်းမေတ္တာထား၍ဆက်ဆံကျင့်သုံးသင့်၏။",
    "Tibetan": "འགྲོ་བ་མིའི་རིགས་རྒྱུད་ཡོངས་ལ་སྐྱེས་ཙམ་ཉིད་ནས་ཆེ་མཐོངས་དང༌།ཐོབ་ཐང་གི་རང་དབང་འདྲ་མཉམ་དུ་ཡོད་ལ།ཁོང་ཚོར་"
               "རང་བྱུང་གི་བློ་རྩལ་དང་བསམ་ཚུལ་བཟང་པོ་ཡོད་པས།ཕན་ཚུན་གཅིག་གིས་གཅིག་ལ་བུ་སྤུན་གྱི་འདུ་ཤེས་འཛིན་པའི་བྱ་སྤྱོད་"
               "ཀྱི་མཐའ་འཛིན་དགོས་པ་ཡིན༎",
    "Dzongkha": "མི་ག་ར་རང་དབང་དང་ཅིག་མཚུངས་སྦེ་སྐྱེས་ཏེ་ཡོདཔ་ཨིན།ཁོང་ལུ་བསམ་ཤེས་དང་བསམ་བློ་ཡོདཔ་ལས་ཕན་ཚུན་སྤུན་ཆའི་"
                "སེམས་ཀྱིས་བྱ་སྤྱོད་འབད་དགོཔ་ཨིན།",
    "Javanese": "ꦱꦧꦼꦤ꧀ꦮꦺꦴꦁꦏꦭꦲꦶꦂꦫꦏꦺꦏꦤ꧀ꦛꦶꦩꦂꦢꦶꦏꦭꦤ꧀ꦢꦂꦧꦺꦩꦂꦠꦧꦠ꧀ꦭꦤ꧀ꦲꦏ꧀ꦲꦏ꧀ꦏꦁꦥꦝ꧉ꦏꦧꦺꦃꦥꦶꦤꦫꦶꦁꦔꦤ꧀"
                "ꦲꦏꦭ꧀ꦭꦤ꧀ꦏꦭ꧀ꦧꦸꦱꦺꦴꦤ꧀ꦭꦤ꧀ꦏꦲꦗꦧ꧀ꦥꦱꦸꦮꦺꦴꦁꦔꦤ꧀ꦱꦮꦶꦗꦶꦭꦤ꧀ꦱꦶꦗꦶꦤꦺꦴꦩꦂꦱꦢꦸꦭꦸꦂ꧉",
}
OCR_ORDER = """PEDIDODECOMPRANº4512/2019 FORNECEDOR:INFORMATICAEQUIPAMENTOSLTDA CNPJ:12.345.678/0001-90
ITEM QTDE DESCRICAO VALORUNIT. VALORTOTAL
01 10 COMPUTADORDESKTOPCOMAMEMORIARAM,PORTASDECOMUNICACAO:SERIAL,USB2.0,HDMIEDISPLAYPORT;PROCESSADORDE8NUCLEOS 3.450,00
02 05 MONITORLED23,8POLEGADASCOMAJUSTEDEALTURAEENTRADASVGA,HDMIEDISPLAYPORTEGARANTIADE36MESES 899,90 4.499,50
CONDICOESDEPAGAMENTO:30DIASAPOSORECEBIMENTODANOTAFISCALEATESTODORECEBEDORRESPONSAVELPELOSETOR
PRAZODEENTREGA:15DIASUTEIS LOCALDEENTREGA:ALMOXARIFADOCENTRAL,RUADASFLORES,123-CENTRO
OPresentepedidodecompraserefereàaquisiçãodeequipamentosdeinformáticaparaoLaboratóriodeEnsinodaEscolaMunicipal
ThePurchaseOrderNumberIsAsFollowsAndIncludesTheDeliveryTermsOfTheSupplierAndTheAddressOfTheWarehouse
"""
MATHS = r"""Seja $A=\begin{pmatrix}a_{11}&a_{12}&\cdots&a_{1n}\\a_{21}&a_{22}&\cdots&a_{2n}\\\vdots&\vdots&\ddots&\vdots\\a_{m1}&a_{m2}&\cdots&a_{mn}\end{pmatrix}$.
$$\det(A)=\sum_{\sigma\in{S_n}}\operatorname{sgn}(\sigma)\prod_{i=1}^{n}a_{i,\sigma(i)}$$
$$AB=\left[\begin{array}{cc}a_{11}b_{11}+a_{12}b_{21}&a_{11}b_{12}+a_{12}b_{22}\\a_{21}b_{11}+a_{22}b_{21}&a_{21}b_{12}+a_{22}b_{22}\end{array}\right]$$
$$\mathbf{x}^{(k+1)}=D^{-1}\left(\mathbf{b}-(L+U)\mathbf{x}^{(k)}\right),\qquad\|\mathbf{x}\|_2=\sqrt{x_1^2+x_2^2+\cdots+x_n^2}$$
A = a11 a12 a13 a14
a21 a22 a23 a24
a31 a32 a33 a34
a41 a42 a43 a44
b1 b2 b3 b4 c1 c2 c3 c4 d1 d2 d3 d4 e1 e2 e3 e4
det A = a11a22a33 + a12a23a31 + a13a21a32 − a13a22a31 − a11a23a32 − a12a21a33
∀ε>0∃δ>0:|x−a|<δ⇒|f(x)−f(a)|<ε, ‖x‖₂=√(x₁²+x₂²+…+xₙ²)
"""
REFERENCES = """[1] Vaswani A, Shazeer N, Parmar N, et al. Attention is all you need[EB/OL].(2017-06-12)[2022-03-01].https://arxiv.org/abs/1706.03762.
[2] Available:<https://doi.org/10.1016/j.neucom.2021.03.091>
[3] 国家统计局.中国统计年鉴2021[EB/OL].http://www.stats.gov.cn/tjsj/ndsj/2021/indexch.htm
[4] https://github.com/pytorch/pytorch/blob/8a2e0e6f8c3b1e5a7a9e0d2c4b6f8a1c3e5d7f9b/torch/nn/modules/transformer.py
[5] (https://drive.google.com/file/d/1aB3xYz9QwErTyUiOpAsDfGhJkLzXcVbN/view?usp=sharing)
[6] https://www.youtube.com/watch?v=dQw4w9WgXcQ&list=PLoROMvodv4rOhcuXMZkNm7j3fVwBBY42z&index=7
[7] https://zh.wikipedia.org/wiki/%E4%B8%AD%E5%8D%8E%E4%BA%BA%E6%B0%91%E5%85%B1%E5%92%8C%E5%9B%BD
[8] www.ncbi.nlm.nih.gov/pmc/articles/PMC7418842/pdf/nihms-1612309.pdf;https://europepmc.org/abstract/MED/32766543
[9] https://storage.googleapis.com/kaggle-data-sets/1234567/2049876/compressed/data.csv.zip?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=gcp-kaggle-com%40kaggle-161607.iam.gserviceaccount.com
"""
HTML_TABLE = """# Resultados

<table border="1" class="dataframe">
<thead>
<tr style="text-align: right;"><th></th><th>date</th><th>region</th><th>sales</th><th>growth</th></tr>
</thead>
<tbody>
<tr><th>0</th><td>2021-01-01</td><td>North</td><td>1,234.50</td><td>0.0523</td></tr>
<tr><th>1</th><td>2021-02-01</td><td>华东地区</td><td>2,345.75</td><td>-0.0131</td></tr>
<tr><th>2</th><td>2021-03-01</td><td>São Paulo</td><td>3,456.00</td><td>0.1270</td></tr>
</tbody>
</table>

<div><svg xmlns="http://www.w3.org/2000/svg" width="460" height="345" viewBox="0 0 460 345"><g id="figure_1"><path \
d="M57.6,307.584L414.72,307.584L414.72,41.472L57.6,41.472z" style="fill:#ffffff"/><path clip-path="url(#p1a2b3c4d5e)" \
d="M73.832727,294.552L106.298182,251.736L138.763636,230.328L171.229091,190.296L203.694545,170.28L236.16,141.048L268.625455,\
112.104L301.090909,96.552L333.556364,75.6L366.021818,60.48L398.487273,54.552" style="fill:none;stroke:#1f77b4;stroke-width:1.5"/>\
<text x="236.16" y="330">Quarter</text><text x="20" y="174.528" transform="rotate(-90,20,174.528)">Sales (thousands)</text></g></svg></div>
"""

def lecture_notes() -> str:
    """German lecture notes as a PDF's text layer gives them: the math font's big delimiters come out as control
    characters (\x10 \x11 for parentheses, \x12 \x13 for bigger ones, \x1a \x1b for braces, \x00 \x01 \x02 \x03 for
    brackets), several kinds in pairs, dense where the formulas are (issue 40: 7 chunks were dropped)."""
    out = ["Lineare Algebra II — Vorlesung 7: Eigenwerte und Diagonalisierbarkeit"]
    for i, (name, space) in enumerate([("f", "V"), ("g", "W"), ("h", "U"), ("A", "K^n"), ("B", "K^m")] * 2):
        out.append(
            f"Satz 7.{i + 1} (Eigenwerte von {name}). Sei {space} ein endlichdimensionaler K-Vektorraum und {name} linear. "
            f"Ein Skalar λ ∈ K heißt Eigenwert von {name}, wenn es ein v ≠ 0 gibt mit {name}(v) = λv. Die Menge\n"
            f"\x12λ ∈ K \x0c\x0c λ ist Eigenwert von {name}\x13 =: Spec({name})\n"
            f"heißt Spektrum, und Eig({name}, λ) := ker\x10{name} − λ id\x11 =:Aλ ist der Eigenraum zu λ.\n"
            f"Beweis. \x10A − λE\x11v = 0 ⇔ v ∈ ker\x10A − λE\x11, also ist λ Eigenwert ⇔ det\x12A − λE\x13 = 0.\n"
            f"χA(t) = det\x12tE − A\x13 = \x1a\x12t − λ1\x13 · … · \x12t − λn\x13\x1b, \x02\x00A{i}\x01\x03 = \x00aij\x01. □\n"
            f"Bemerkung. µ(λ) ≥ dim Eig({name}, λ) ≥ 1 für λ ∈ Spec({name}); Summe \x10µ(λ)\x11 = n.")
    return "\n\n".join(out)


def matrix_manual() -> str:
    """A PDF manual's tables of transformation matrices: the symbol font's bracket pieces come out as private-use
    glyphs (U+F8EB-U+F8F8), its unmapped glyphs as NULs and other controls (issue 40: 1 chunk was dropped)."""
    ops = [("Translation", ("1", "0", "0", "1", "tx", "ty")), ("Skalierung", ("sx", "0", "0", "sy", "0", "0")),
           ("Rotation", ("cos θ", "sin θ", "−sin θ", "cos θ", "0", "0")),
           ("Scherung", ("1", "tan α", "tan β", "1", "0", "0")), ("Spiegelung", ("−1", "0", "0", "1", "0", "0"))]
    out = []
    for name, (a, b, c, d, e, f) in ops:
        out.append(f"{name}\n\nDie Matrix der {name} im Koordinatensystem des Geräts ist [{a} {b} {c} {d} {e} {f}]; ein "
                   f"Punkt (x, y) wird auf (x·{a} + y·{c} + {e}, x·{b} + y·{d} + {f}) abgebildet:\n\n"
                   f"| \uf8eb | {a} | {b} | 0 | \uf8f6 |\n"
                   f"| \uf8ec\x00 | {c} | {d} | 0 | \x00\uf8f7 |\n"
                   f"| \uf8ed\x01 | {e} | {f} | 1 | \x01\uf8f8 |")
    return "\n\n".join(out)


def football_seasons() -> str:
    """A plain-text table of a football club's seasons, mostly numbers, from a file once converted with the wrong
    encoding: each dash (the seasons' en dash, the em dash of an empty cell) is a U+FFFD (issue 40: 6 chunks were
    dropped)."""
    rng = random.Random(40)
    lines = ["Club Season League FA Cup League Cup Europe Other Total",
             "Division Apps Goals Apps Goals Apps Goals Apps Goals Apps Goals Apps Goals"]
    for year in range(1950, 2020):
        n = [rng.randint(0, 46) if rng.random() < 0.5 else None for _ in range(12)]
        tier = "First Division" if year < 1992 else "Premier League"
        lines.append(f"Everton {year}\ufffd{(year + 1) % 100:02d} {tier} " + " ".join("\ufffd" if x is None else str(x)
                                                                                   for x in n))
    lines.append("Club total " + " ".join(str(rng.randint(300, 2000)) for _ in range(12)))
    return "\n".join(lines)


def matrix_derivations() -> str:
    """A page of hyperbolic geometry that is mostly formulas, with few words between them, as a PDF's text layer gives
    it: the math font's big brackets as control characters (issue 46 item 5: two such chunks were dropped)."""
    out = []
    for i in range(6):
        out.append("\n".join([
            f"4.{i + 1} HYPERBOLISCHE GEOMETRIE {55 + i}",
            "\x12a b\nc d\x13\x12a′ b′\nc′ d′\x13 = \x12aa′ + bc′ ab′ + bd′\nca′ + dc′ cb′ + dd′\x13 , g · z = az + b\ncz + d ,",
            "Im(g · z) = Im z\n|cz + d|2 , \x10g · z\x11′ = 1\n(cz + d)2 , T = \x121 1\n0 1\x13 , S = \x120 −1\n1 0\x13 , S2 = −E ,",
            f"(ST)3 = −E , \x1a\x12a b\nc d\x13 ∈ SL2(Z)\x1b = ⟨S, T⟩ , \x02\x00z{i} z{i + 1}\x01\x03 ↦ \x00az{i} + bz{i + 1}\x01 ,",
            "d(gz, gw) = d(z, w) , cosh d(z, w) = 1 + |z − w|2\n2 Im z Im w , \x10x + iy\x11 ↦ \x10−x + iy\x11 ,",
            "\x12cos θ − sin θ\nsin θ cos θ\x13 · i = i , \x12y1/2 xy−1/2\n0 y−1/2\x13 · i = x + iy , Stab(i) = SO(2) ."]))
    return "\n\n".join(out)


HELD_OUT = {"lecture notes": lecture_notes(), "matrix manual": matrix_manual(), "football seasons": football_seasons(),
            "matrix derivations": matrix_derivations()}
ODD_BUT_TEXT = {                                     # language behind a few odd characters
    "colored log": "\x1b[32mINFO\x1b[0m 2023-01-01 12:00:01 server started on port 8080, workers ready\n" * 12,
    "glyph stand-in": "\x03".join("The quick brown fox jumps over the lazy dog while the farmer sleeps".split()) * 8,
    "mis-decoded": "Pedido de compra n\ufffd 4512: aquisi\ufffd\ufffdo de equipamentos de inform\ufffdtica para o "
                   "laborat\ufffdrio, entrega em at\ufffd quinze dias \ufffdteis ap\ufffds o recebimento. " * 4,
}
HANDMADE = {"Chinese paper": CHINESE_PAPER, "Classical Chinese": CLASSICAL_CHINESE, **UDHR, "OCR": OCR_ORDER,
            "maths": MATHS, "references": REFERENCES, "HTML table": HTML_TABLE, **ODD_BUT_TEXT, **HELD_OUT}


def cldr_texts() -> dict[str, list[str]]:
    """script -> texts: for each CLDR locale without a territory, its names of languages, territories, months
    and days, once with spaces and once run together (as OCR or a script without spaces writes them). The
    root locale's placeholders for months a locale does not name ("M01") are codes, not language: run together
    ("M01M02...M12SunMon") they look like base64, and no document writes them."""
    likely = get_global("likely_subtags")
    out: dict[str, list[str]] = defaultdict(list)
    for ident in locale_identifiers():
        language, territory, script, *_ = parse_locale(ident)
        if territory or ident == "root":
            continue
        locale = Locale.parse(ident)
        names = [*locale.languages.values(), *locale.territories.values(),
                 *locale.months["format"]["wide"].values(), *locale.days["format"]["wide"].values()]
        names = [name for name in names if not PLACEHOLDER.match(name)]
        script = script or parse_locale(likely.get(language, ident))[2]
        spaced = " ".join(names)
        out[script] += [spaced, "".join(spaced.split())]
    return out


def chunks_of(text: str, skip_junk: bool = True) -> tuple[list[str], int]:
    """The chunks the structure step makes of `text` (one section a paragraph) and how many it skipped as junk."""
    spec = SPEC if skip_junk else ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30, 48, False)
    kept, junk = [], 0
    for section in page_sections(Page(None, text), Outline()):
        made = section_chunks(section, spec, Doc("t.txt", "t.txt"))
        kept += made.chunks
        junk += made.junk
    return kept, junk


def test_every_cldr_language_in_every_script_is_kept_with_or_without_spaces() -> None:
    corpus = cldr_texts()
    assert len(corpus) >= 40 and {"Latn", "Cyrl", "Arab", "Hans", "Hant", "Jpan", "Kore", "Thai", "Laoo", "Khmr",
                                  "Mymr", "Tibt", "Deva", "Ethi", "Hebr", "Grek"} <= set(corpus)
    dropped = []
    for script, texts in corpus.items():
        for text in texts:
            windows = [text[i:i + 1500] for i in range(0, len(text), 1000)]
            dropped += [(script, w[:60]) for w in windows if is_junk(w)]
            dropped += [(script, c[:60]) for c in chunks_of(text[:4000], skip_junk=False)[0] if is_junk(c)]
    assert not dropped, dropped[:10]


@pytest.mark.parametrize("name", HANDMADE)
def test_text_without_spaces_ocr_formulas_tables_and_references_are_kept(name: str) -> None:
    text = HANDMADE[name]
    kept, junk = chunks_of(text)
    assert junk == 0 and kept, [c[:60] for c in chunks_of(text, skip_junk=False)[0] if is_junk(c)]
    assert not is_junk(text)


@pytest.mark.parametrize("name", HELD_OUT)
def test_formulas_among_prose_a_matrix_in_a_table_and_a_table_of_numbers_are_kept(name: str) -> None:
    """Issue 40, item 3: several chunks each, none dropped; control characters are dropped from the kept text."""
    kept, junk = chunks_of(HELD_OUT[name])
    assert junk == 0 and len(kept) >= 2, (junk, len(kept))
    assert not any(re.search(r"[\x00-\x08\x0e-\x1a]", c) for c in kept)
    assert sum("λ" in c for c in kept) >= 5 if name == "lecture notes" else True
    assert any("\uf8eb" in c for c in kept) if name == "matrix manual" else True


def test_gb18030_classical_chinese_is_kept() -> None:
    text = CLASSICAL_CHINESE.encode("gb18030").decode("gb18030")
    assert chunks_of(text)[1] == 0 and not is_junk(text)


def random_bytes(seed: int, n: int = 3000) -> bytes:
    return random.Random(seed).randbytes(n)


def xxd(data: bytes) -> str:
    return "\n".join(f"{i:08x}: " + " ".join(data[j:j + 2].hex() for j in range(i, i + 16, 2)) + "  " +
                     "".join(chr(b) if 32 <= b < 127 else "." for b in data[i:i + 16]) for i in range(0, len(data), 16))


def wrapped(text: str, width: int = 76) -> str:
    return "\n".join(text[i:i + width] for i in range(0, len(text), width))


JUNK = {
    "base64": lambda s: wrapped(base64.b64encode(random_bytes(s)).decode()),
    "base64 one line": lambda s: base64.b64encode(random_bytes(s)).decode(),
    "base64 of text": lambda s: wrapped(base64.b64encode((CHINESE_PAPER + MATHS + REFERENCES).encode()).decode()),
    "base64 of Thai": lambda s: wrapped(base64.b64encode((UDHR["Thai"] * 20).encode()).decode(), 64),
    "data: URI, markdown": lambda s: f"![plot](data:image/png;base64,{base64.b64encode(random_bytes(s)).decode()})",
    "data: URI, HTML": lambda s: f'<img src="data:image/png;base64,{base64.b64encode(random_bytes(s)).decode()}">',
    "hex bytes": lambda s: " ".join(f"{b:02x}" for b in random_bytes(s, 1500)),
    "hex string": lambda s: wrapped(random_bytes(s, 2000).hex(), 64),
    "xxd": lambda s: xxd(random_bytes(s, 2000)),
    "C array": lambda s: ",\n".join(", ".join(f"0x{b:02X}" for b in random_bytes(s + i, 12)) for i in range(120)),
    "binary as latin-1": lambda s: random_bytes(s).decode("latin-1"),
    "binary as UTF-8": lambda s: random_bytes(s).decode("utf-8", "replace"),
    "binary as cp1252": lambda s: random_bytes(s).decode("cp1252", "replace"),
    "binary as cp1252, ignored": lambda s: random_bytes(s).decode("cp1252", "ignore"),
}


@pytest.mark.parametrize("name", JUNK)
def test_encoded_data_hex_dumps_and_binary_are_still_junk(name: str) -> None:
    """Every chunk of them is junk but a short tail (under 100 visible characters: when in doubt, keep)."""
    for seed in range(5):
        chunks, _ = chunks_of(JUNK[name](seed), skip_junk=False)
        kept = [c for c in chunks if not is_junk(c)]
        assert all(len("".join(c.split())) < 100 for c in kept) and len(kept) <= 2, [c[:60] for c in kept]


def text_pdf(path: Path, text: str) -> None:
    """A PDF of `text`, line by line in Helvetica: its control characters come back from the text layer as they
    are (what Helvetica cannot show, such as λ, comes back as a middle dot)."""
    import pymupdf

    lines = [line for para in text.split("\n") for line in (textwrap.wrap(para, 95) or [""])]
    doc = pymupdf.open()
    for start in range(0, len(lines), 60):
        page = doc.new_page(width=595, height=842)
        for i, line in enumerate(lines[start:start + 60]):
            page.insert_text((40, 50 + 12 * i), line, fontname="helv", fontsize=9)
    doc.save(path)


@pytest.mark.slow
def test_a_run_keeps_every_language_file_and_skips_only_the_blobs(work: Path) -> None:
    """Real files through the whole pipeline: GB18030 decoded by the loader, markdown with an HTML table, a
    data: URI beside prose (the prose stays), a base64 file (nothing stays), and one of each kind issue 40 held
    out: PDFs whose text layer holds control characters (formulas among prose, a matrix in a table), a table of
    numbers."""
    docs = work / "docs"
    (docs / "taohuayuan.txt").write_bytes(CLASSICAL_CHINESE.encode("gb18030"))
    (docs / "paper.txt").write_text(CHINESE_PAPER, encoding="utf-8")
    (docs / "udhr.md").write_text("\n\n".join(f"## {k}\n\n{v}" for k, v in UDHR.items()), encoding="utf-8")
    (docs / "pedido.txt").write_text(OCR_ORDER, encoding="utf-8")
    (docs / "algebra.md").write_text(MATHS + "\n\n" + REFERENCES, encoding="utf-8")
    (docs / "results.md").write_text(HTML_TABLE, encoding="utf-8")
    (docs / "figure.md").write_text("Sales rose in every quarter of the year, led by the northern region.\n\n"
                                    + JUNK["data: URI, markdown"](1) + "\n", encoding="utf-8")
    (docs / "blob.txt").write_text(JUNK["base64"](2))
    text_pdf(docs / "eigenwerte.pdf", HELD_OUT["lecture notes"])     # control characters in a PDF's text layer
    text_pdf(docs / "matrizen.pdf", HELD_OUT["matrix manual"])
    text_pdf(docs / "hyperbolisch.pdf", HELD_OUT["matrix derivations"])
    (docs / "seasons.txt").write_text(HELD_OUT["football seasons"], encoding="utf-8")
    res = run(docs, work, config=NULL)
    assert res.rc == 0, res.stderr
    files = res.by_path()
    assert files["blob.txt"]["status"] == "empty" and files["blob.txt"]["junk_chunks"] > 5
    assert files["figure.md"]["status"] == "ingested" and files["figure.md"]["junk_chunks"] > 5
    warning = next(w for w in files["figure.md"]["warnings"] if "non-language" in w)    # what was skipped shows
    assert "the first began '![plot](data:image/png;base64," in warning and len(warning) < 200, warning
    language = {p: f.get("junk_chunks", 0) for p, f in files.items() if p not in ("blob.txt", "figure.md")}
    assert language == dict.fromkeys(language, 0) and len(language) == 10, files
    assert all(files[p]["status"] == "ingested" and files[p]["chunks"] > 0 for p in language)
