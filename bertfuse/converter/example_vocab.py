"""The vocab.txt that `bertfuse example` writes beside its checkpoint: Google's layout
([PAD] 0, [unused*], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 when the vocab is that
large), then single characters, their ## continuations, whole lower-case words and common
## suffixes, so that real English text tokenizes into real pieces. Lower-case only: an
uncased vocab, as the tokenizer sees (bertfuse/text.py)."""

from __future__ import annotations

import string

from bertfuse.text import GOOGLE_IDS

_SMALL_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

_WORDS = """
the of and to a in is it you that he was for on are with as his they be at one have this
from or had by not word but what some we can out other were all there when up use your how
said an each she which do their time if will way about many then them write would like so
these her long make thing see him two has look more day could go come did number sound no
most people my over know water than call first who may down side been now find any new work
part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line
differ turn cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again
animal point mother world near build self earth father head stand own page should country
found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late
run while press close night real life few north open seem together next white children begin
got walk example ease paper group always music those both mark often letter until mile river
car feet care second book carry took science eat room friend began idea fish mountain stop
once base hear horse cut sure watch color face wood main enough plain girl usual young ready
above ever red list though feel talk bird soon body dog family direct pose leave song measure
door product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb
sing listen six table travel less morning ten simple several vowel toward war lay against
pattern slow center love person money serve appear road map rain rule govern pull cold notice
voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide
surface deep moon island foot system busy test record boat common gold possible plane stead
dry wonder laugh thousand ago ran check game shape equate hot miss brought heat snow tire
bring yes distant fill east paint language among brown fox jumps lazy hello search query
model learning data text bert token embedding vector rank document
""".split()

_SUFFIXES = ("s", "es", "ed", "ing", "er", "est", "ly", "ness", "ment", "tion", "able", "ful",
             "less", "ity", "ize", "al", "ous", "ive", "en", "y")


def example_vocab(size: int) -> list[str]:
    """`size` tokens, the special ones at Google's ids when size > 103 ([] below 5)."""
    if size < len(_SMALL_SPECIALS):
        return []
    if size <= max(GOOGLE_IDS.values()):
        head = list(_SMALL_SPECIALS)
    else:
        head = [f"[unused{i - 1}]" for i in range(max(GOOGLE_IDS.values()) + 1)]
        for token, i in GOOGLE_IDS.items():
            head[i] = token
    chars = list(string.punctuation + string.digits + string.ascii_lowercase)
    pieces = chars + ["##" + c for c in string.digits + string.ascii_lowercase] + \
        [w for w in _WORDS if len(w) > 1] + ["##" + s for s in _SUFFIXES]
    tokens = (head + list(dict.fromkeys(pieces)))[:size]
    tokens += [f"[unused{i}]" for i in range(100, 100 + size - len(tokens))]
    return tokens
