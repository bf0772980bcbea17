"""Chat templates as a hostile model file would carry them: each must be refused with one sentence
that says what it did (the fragment), quickly, without allocating what it asks for."""

HOSTILE = {
    # recursion
    "macro recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested calls more than"),
    "loop recursion": ("{% for x in [1, 2] recursive %}{{ loop([1, 2]) }}{% endfor %}", "nested calls more than"),
    "deep nesting": ("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "deeper than Python's stack"),
    # repetition and growth
    "string repetition": ("{{ 'x' * 1000000000 }}", "by repeating a value"),
    "list repetition": ("{{ ['abc'] * 1000000000 }}", "by repeating a value"),
    "doubling with ~": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s }}", "by concatenating with ~"),
    "doubling with +": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}", "by adding"),
    "shared nesting": ("{% set a = ['x' * 100000] %}{% for i in range(40) %}{% set a = [a, a] %}{% endfor %}"
                       "{% set b = ['x' * 100000, 'x' * 100000] %}{% set c = [b, b] %}{% set d = [c, c] %}"
                       "{% set e = [d, d] %}{% set f = [e, e] %}{{ f }}", "in one value"),
    "namespace nesting": ("{% set n = namespace(v='x' * 100000) %}{% set m = namespace(a=n, b=n) %}"
                          "{% set o = namespace(a=m, b=m) %}{% set p = namespace(a=o, b=o) %}"
                          "{% set q = namespace(a=p, b=p) %}{{ q }}", "in one value"),
    "squaring": ("{% set ns = namespace(v=3) %}{% for i in range(40) %}{% set ns.v = ns.v * ns.v %}{% endfor %}",
                 "bits"),
    "power": ("{{ 2 ** 10000000 }}", "bits"),
    "captured macro": ("{% macro m() %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endmacro %}"
                       "{% set y = m() %}", "in all it prints"),
    "filter block": ("{% filter upper %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endfilter %}",
                     "in all it prints"),
    "big output": ("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", "in its output"),
    # huge ranges and loops that multiply work
    "huge range": ("{% for i in range(10 ** 12) %}{% endfor %}", "range"),
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "time limit"),
    "nested string loops": ("{% set s = 'x' * 500000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
                            "time limit"),
    # filters and methods that build large strings
    "center": ("{{ 'x' | center(1000000000) }}", "center filter"),
    "indent": ("{{ ('\n' * 500000) | indent(1000) }}", "indent filter"),
    "join": ("{{ range(100000) | join('x' * 100000) }}", "join filter"),
    "replace": ("{{ ('x' * 100000) | replace('', 'y' * 1000) }}", "replace filter"),
    "format width": ("{{ '%999999999s' | format('x') }}", "format filter"),
    "wordwrap": ("{{ ('x' * 500000) | wordwrap(1, wrapstring='y' * 1000) }}", "wordwrap filter"),
    "tojson indent": ("{% set a = [[[[[[[[[[1]]]]]]]]]] %}{{ [a, a, a, a, a, a, a, a] | tojson(indent=50000) }}",
                      "tojson filter"),
    "map then list": ("{{ range(100000) | map('center', 100000) | list | length }}", "collecting a sequence"),
    "ljust": ("{{ 'x'.ljust(1000000000) }}", ".ljust()"),
    "str.format": ("{{ '{:>999999999}'.format('x') }}", ".format()"),
    "percent": ("{{ '%0999999999d' % 1 }}", "formatting with %"),
    "translate": ("{{ ('a' * 100000).translate({97: 'b' * 100000}) }}", ".translate()"),
    "dict.fromkeys": ("{{ {}.fromkeys(range(100000), 'x' * 100000) }}", "in one value"),
    # escapes and plain errors
    "attribute escape": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "globals escape": ("{{ cycler.__init__.__globals__ }}", "unsafe"),
    "include": ("{% include 'x' %}", "failed to render"),
    "syntax error": ("{% for %}", "failed to render"),
    "raise_exception": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "huge source": ("x" * 300000, "characters long"),
}
