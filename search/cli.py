"""`triaccel search | resume | export | searches | ui`: thin shells over triaccel.search's modules.

Heavy imports (Ray, Optuna, MLflow) happen inside the commands, so `triaccel --help` is fast.
"""
from __future__ import annotations

import os
import sys

from triaccel.search.storage import use_storage


def exit_status(command: str, out: dict | None) -> int:
    """1 where every trial of the search failed, else 0. Such a search still closes FINISHED and exports its
    baseline, but a script that runs it (search, then export, then train) must not read it as a success: the
    failures are nearly always the user's model or data failing on the workers, which every trial repeats."""
    if not out or not out.get("trials") or out.get("failed") != out["trials"]:
        return 0
    print(f"triaccel {command} '{out['name']}': every trial failed ({out['failed']} of {out['trials']}; each one's "
          f"reason is on its line above and in its MLflow run): exit status 1", file=sys.stderr, flush=True)
    return 1


def cmd_search(args) -> int:
    use_storage(args.storage)
    from triaccel.search.runner import run_search

    out = run_search(args.space, name=args.name, trials=args.trials, concurrency=args.concurrency,
                     gpus_per_trial=args.gpus_per_trial, address=args.address, confirm=args.confirm,
                     fresh_baselines=args.fresh_baselines, warm_start=args.warm_start,
                     warm_start_k=args.warm_start_k)
    return exit_status("search", out)


def cmd_resume(args) -> int:
    use_storage(args.storage)
    from triaccel.search.runner import resume_search

    return exit_status("resume", resume_search(args.name, address=args.address, confirm=args.confirm,
                                               production_epochs=args.production_epochs))


def cmd_extend(args) -> int:
    use_storage(args.storage)
    from triaccel.search.extend import extend_search

    return exit_status("extend", extend_search(args.name, args.trials, address=args.address, confirm=args.confirm))


def cmd_export(args) -> int:
    use_storage(args.storage)
    from triaccel.search.export import export

    import yaml

    from triaccel.search.export import train_command
    from triaccel.search.state import read_state

    p = export(args.name, args.out, args.pick, force=args.force, epochs=args.epochs)
    prov = yaml.safe_load(p.read_text())["provenance"]
    print(f"wrote {p} ({prov['why']}): train with `{train_command(read_state(args.name), p)}`")
    if prov.get("deleted_runs_ignored"):
        print(f"  {prov['deleted_runs_ignored']} run(s) of search '{args.name}' are deleted in MLflow and were not "
              f"considered: restore them in the MLflow UI (or `mlflow gc` them for good) and export again to count them")
    epochs = yaml.safe_load(p.read_text())["epochs"]
    if args.epochs is None and epochs == prov["searched_epochs"]:
        print(f"  it trains {epochs} epochs, the search's budget: for production add "
              f"`--set epochs=N` (or export with --epochs N)")
    elif args.epochs is None:  # the search's production_epochs: the space's, or resume --production-epochs
        print(f"  it trains {epochs} epochs, the search's production_epochs (it scored {prov['searched_epochs']}): "
              f"export --epochs N sets another length")
    b = prov.get("baseline")
    if b and prov["exported"] == "baseline" and args.pick == "baseline":
        print(f"  the static AMP run {b['run']}, as --pick baseline asked: train the baseline as exported")
    elif b and prov["exported"] == "baseline":
        print(f"  the search found nothing better than static AMP {b['run']} in runs of {b['search_gpu_s']:.0f} "
              f"device-seconds: train the baseline as exported")
    elif b:
        from triaccel.search.results import trade_words

        pay = b["payback_epochs"]
        made_of = f", {trade_words(b)}" if "epoch_time_ratio" in b else ""
        print(f"  {b['ratio']:.2f}x the efficiency of the static baseline {b['run']} "
              f"(val acc {b['val_acc_diff_pp']:+.2f} pp{made_of}); the search's runs used {b['search_gpu_s']:.0f} "
              f"device-seconds (its phases' wall time adds start-up), "
              + (f"repaid after {pay:.0f} epochs of production training" if pay is not None else
                 "which faster epochs do not repay (the exported config is not faster per epoch"
                 + ("; its gain is memory)" if b["ratio"] > 1 and b.get("peak_mem_ratio", 1) < 1 else ")")))
        if pay is None:
            print(f"  where time matters more than memory: `triaccel export {args.name} --pick baseline "
                  f"--out FILE` writes the static run {b['run']}")
    return 0


def cmd_searches(args) -> int:
    use_storage(args.storage)
    from triaccel.search.listing import list_searches
    from triaccel.search.state import tune_root

    rows = list_searches()
    if not rows:
        print(f"no searches under {tune_root()}")
        return 0
    # best eff / x base / exports: what `triaccel export NAME` would write now (a trial, or the baseline
    # when nothing feasible beat it), its efficiency and its ratio to the reference baseline
    print(f"{'name':<24} {'space':<34} {'created':<20} {'done':>8} {'failed':>6} {'best eff':>10} {'x base':>7} "
          f"{'exports':>8}  state")
    for r in rows:
        best = f"{r['best']:.2f}" if r.get("best") is not None else "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
        # a finished search says so: `done 6/8` would read as unfinished where ASHA stopped two early
        done = "finished" if r.get("search_finished") else f"{r.get('finished', '?')}/{r.get('trials', '?')}"
        space = str(r["space"])
        space = space if len(space) <= 34 else "..." + space[-31:]  # the file's name kept, the cut said
        print(f"{r['name']:<24} {space:<34} {r['created']:<20} {done:>8} {r.get('failed', '?'):>6} "
              f"{best:>10} {ratio:>7} {r.get('exports') or '-':>8}  {run_state(r)}")
        if r.get("error"):  # an unreadable state or store: say why the row has no figures
            print(f"  {r['name']}: {r['error']}")
    return 0


def run_state(row: dict) -> str:
    """running (its driver: command, pid, host), finished, or stopped (nothing runs it: resume continues it)."""
    from triaccel.search.state import again

    d = row.get("driver")
    if d is not None:  # also a finished search's `resume --confirm K` or `extend`
        who = f"{d['command']}, pid {d['pid']} on {d['host']}" if {"command", "pid", "host"} <= d.keys() else ""
        return f"running ({who})" if who else "running"
    if row.get("search_finished"):
        return "finished"
    return f"stopped: `{again('resume', row['name'])}` continues it"


def cmd_ui(args) -> int:
    from triaccel.tracking import shown, tracking_uri

    # the options first: a refused --host or --port writes nothing (not even the default store's mlruns/)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.allow_remote:
        print(f"triaccel: error: --host {args.host} exposes the UI beyond this machine; add --allow-remote "
              f"to mean it", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"triaccel: error: --port {args.port}: not a TCP port (1-65535)", file=sys.stderr)
        return 2
    uri = tracking_uri(None, write=False)  # no folder made: a store that is not there is said below
    if not uri.startswith("sqlite:") and not uri.startswith("postgresql") and not uri.startswith("mysql"):
        server = uri.startswith(("http://", "https://"))  # a team's MLflow server serves its own UI: open it
        print(f"triaccel: error: the UI needs a database store; MLFLOW_TRACKING_URI is {shown(uri)}"
              + (": an MLflow server, whose own UI is at that address" if server else ""), file=sys.stderr)
        return 2
    # MLflow reports a port in use deep in its server's log and still exits 0: check it here, binding the
    # address as the server will (IPv6 for a host with a colon, as uvicorn does), without SO_REUSEADDR
    import errno
    import socket

    where = f"[{args.host}]:{args.port}" if ":" in args.host else f"{args.host}:{args.port}"
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        addr = socket.getaddrinfo(args.host, args.port, family, socket.SOCK_STREAM)[0][4]
    except OSError as e:
        print(f"triaccel: error: --host {args.host}: cannot resolve it ({e.strerror or e})", file=sys.stderr)
        return 2
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
            s.bind(addr)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            why = f"is already in use ({e.strerror}; stop what holds it or pick another --port)"
        else:
            why = f"cannot be bound ({e.strerror or e})"
        print(f"triaccel: error: --port {args.port}: {where} {why}", file=sys.stderr)
        return 2
    from triaccel.tracking import client

    if not os.environ.get("MLFLOW_TRACKING_URI") and uri.startswith("sqlite:///"):
        from triaccel.search.state import sqlite_path

        if not sqlite_path(uri).exists():  # not a new, empty store served as if it held the runs
            print(f"triaccel: error: no MLflow store in this folder ({sqlite_path(uri).resolve()}): run `triaccel ui` in the "
                  f"folder where you ran train or search, or set MLFLOW_TRACKING_URI to the store", file=sys.stderr)
            return 2
    # a store MLflow cannot open (a file that is no database): one line, as train and search say it,
    # not the URL line and then the server's traceback
    client(uri, key="MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") else "the MLflow store")
    cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", args.host,
           "--port", str(args.port), "--workers", "1"]
    print(f"MLflow UI for {shown(uri)} at http://{args.host}:{args.port}  (Ctrl-C stops it)", flush=True)
    # a viewer: without this MLflow 3 also starts its GenAI job runner (seven worker processes) on a database
    # store; a user who wants it sets the variable
    os.environ.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    os.execv(sys.executable, cmd)


STORAGE_HELP = ("folder, or a URI pyarrow opens as one (file:///folder, local:///folder), holding the searches' Tune "
                "state (default mlruns/tune, or TRIACCEL_TUNE_DIR); remote storage is used mounted")
# the score every search ranks by (triaccel.metrics.efficiency_score), said once in --help and the summary
SCORE = ("eff is the paper's efficiency score (§4.2): validation accuracy (%) / (epoch time (s) x peak GPU memory "
         "(GiB) x 100) x 100, the epoch time the mean of the last five epochs; higher is better.")

ADDRESS_EMPTY = "an empty address; give HOST:PORT, ray://HOST:PORT or auto, or leave --address out"


def add_commands(sub, once) -> None:
    """The search commands; ``once``: the argparse action of an option that takes one value."""
    s = sub.add_parser("search", help="search Tri-Accel thresholds with Ray Tune + Optuna",
                       description="Search Tri-Accel thresholds with Ray Tune + Optuna, holding every trial to the "
                                   "accuracy of static AMP baselines. " + SCORE)
    s.add_argument("--space", required=True, action=once, empty="an empty path; give a space YAML or a shipped "
                   "space's name", help="space YAML (spaces/*.yaml), or a shipped space's name")
    s.add_argument("--trials", type=int, help="number of trials (overrides the space)")
    s.add_argument("--name", action=once, help="search name (default: the space's name); state in mlruns/tune/NAME")
    s.add_argument("--concurrency", type=int, help="trials at once (overrides the space)")
    s.add_argument("--gpus-per-trial", type=float, help="fraction of a GPU per trial (overrides the space)")
    s.add_argument("--address", action=once, empty=ADDRESS_EMPTY, help="join an existing Ray cluster: HOST:PORT of its head (as `ray start --head` prints it) or "
                        "auto; default: a new local Ray")
    s.add_argument("--confirm", type=int, default=None, metavar="K",
                   help="re-run the top K configurations, and the space's start points, alone before export "
                        "(undistorted by sharing); default 3 when trials share a GPU, else 0 (none at all)")
    s.add_argument("--fresh-baselines", action="store_true",
                   help="train the static baselines again, even where the store holds ones measured with the same "
                        "settings, device and versions (reused by default)")
    s.add_argument("--warm-start", action=once, metavar="NAME",
                   empty="an empty name; give an earlier search's name",
                   help="start from the best feasible trials of an earlier search (their keys this space searches, "
                        "clipped to its bounds), run first as start points")
    s.add_argument("--warm-start-k", type=int, metavar="K", help="how many of its best trials (default 3)")
    s.add_argument("--storage", action=once, metavar="PATH_OR_URI", help=STORAGE_HELP)
    s.set_defaults(func=cmd_search)

    r = sub.add_parser("resume", help="continue an interrupted search")
    r.add_argument("name", help="the search's name (`triaccel searches` lists them)")
    r.add_argument("--address", action=once, empty=ADDRESS_EMPTY,
                   help="join an existing Ray cluster (HOST:PORT or auto); default: the search's own")
    r.add_argument("--confirm", type=int, default=None, metavar="K",
                   help="as for search; default: what the search was started with")
    r.add_argument("--production-epochs", type=int, default=None, metavar="N",
                   help="judge a finished search again at N epochs, the length you train (its top K trials, K "
                        "from --confirm, else the search's own, else 3, and the reference, alone, paired by seed); "
                        "its export then trains N epochs")
    r.add_argument("--storage", action=once, metavar="PATH_OR_URI", help=STORAGE_HELP)
    r.set_defaults(func=cmd_resume)

    x = sub.add_parser("extend", help="give a finished search more trials; the sampler sees every earlier one")
    x.add_argument("name", help="the search's name (`triaccel searches` lists them)")
    x.add_argument("--trials", type=int, required=True, help="how many trials to add")
    x.add_argument("--address", action=once, empty=ADDRESS_EMPTY,
                   help="join an existing Ray cluster (HOST:PORT or auto); default: the search's own")
    x.add_argument("--confirm", type=int, default=None, metavar="K", help="as for search")
    x.add_argument("--storage", action=once, metavar="PATH_OR_URI", help=STORAGE_HELP)
    x.set_defaults(func=cmd_extend)

    e = sub.add_parser("export", help="write the tuned config of a search as a training YAML")
    e.add_argument("name", help="the search's name (`triaccel searches` lists them)")
    e.add_argument("--out", required=True, action=once, help="the YAML file to write (not replaced without --force)")
    e.add_argument("--pick", default="best",
                   help="best (default: the judge's verdict, else the best feasible trial, else the best static "
                        "run), baseline (the best static run, for when its time matters more than the export's "
                        "memory), or pareto-N (entry N of the Pareto front)")
    e.add_argument("--force", action="store_true", help="replace --out if it exists")
    e.add_argument("--epochs", type=int, help="epochs of the exported config (default: the search's budget, "
                                              "often short; the lr schedule stretches to it)")
    e.add_argument("--storage", action=once, metavar="PATH_OR_URI", help=STORAGE_HELP)
    e.set_defaults(func=cmd_export)

    ls = sub.add_parser("searches", help="list past searches",
                        description="List the searches under mlruns/tune (--storage, TRIACCEL_TUNE_DIR): each one's "
                                    "space, whether it finished (or how many trials are done), its failures, and what "
                                    "`triaccel export NAME` would write now with its efficiency score.")
    ls.add_argument("--storage", action=once, metavar="PATH_OR_URI", help=STORAGE_HELP)
    ls.set_defaults(func=cmd_searches)

    u = sub.add_parser("ui", help="serve the MLflow UI on 127.0.0.1")
    u.add_argument("--port", type=int, default=5000, help="TCP port of the UI (default 5000)")
    u.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1: this machine only)")
    u.add_argument("--allow-remote", action="store_true", help="allow a --host other than loopback")
    u.set_defaults(func=cmd_ui)
