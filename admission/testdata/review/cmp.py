import sys, collections
def load(fn):
    d = {}
    for line in open(fn):
        if not line.startswith('ZZ|'): continue
        p = line.strip().split('|')
        fam, cfg, seed = p[1], p[2], int(p[3])
        kv = {}
        for x in p[4:]:
            k, v = x.split('=', 1); kv[k] = float(v)
        d[(fam, cfg, seed)] = kv
    return d
old, new = load(sys.argv[1]), load(sys.argv[2])
fams = collections.OrderedDict()
for k in old:
    fams.setdefault(k[0], []).append(k)
for fam, keys in fams.items():
    print("==", fam, len(keys), "runs")
    metrics = list(old[keys[0]].keys())
    for m in metrics:
        so = sum(old[k][m] for k in keys); sn = sum(new[k][m] for k in keys)
        if m.lower().endswith('p99'):
            import statistics
            mo = statistics.median(old[k][m] for k in keys); mn = statistics.median(new[k][m] for k in keys)
            wo = sum(1 for k in keys if new[k][m] > 1.5*old[k][m] + 20)
            bo = sum(1 for k in keys if old[k][m] > 1.5*new[k][m] + 20)
            print(f"  {m:10s} median old {mo:9.1f} new {mn:9.1f} max old {max(old[k][m] for k in keys):8.1f} new {max(new[k][m] for k in keys):8.1f}  new>1.5x+20ms: {wo}  old>1.5x+20: {bo}")
        else:
            print(f"  {m:10s} sum old {so:12.0f} new {sn:12.0f}  ({(sn-so)/max(so,1)*100:+.1f}%)")
