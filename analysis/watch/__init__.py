"""Watch: the report's spike detection and SLO rules, run window by window, firing and resolving alerts.

One evaluation per closed window (`Watcher.tick`): the window's requests join a buffer of
the last `lookback` windows, and

- tail spike: `analysis.stats.spikes.detect` runs on the buffer; while the newest window is part
  of a significant spike (p99 up, p50 flat) the alert fires, with the report's explanation
  (`analysis.report.explain_spikes`: stage shares, the top dimension and its counterfactual,
  exemplar trace ids). It resolves on the first evaluated window that is not;
- SLO rules (`parse_rules`): `p99(ttft) < 2s`, `p99(e2e) < 20s for tenant=acme`,
  `error_rate < 1%` and `burn(e2e < 20s, 99%) > 14.4 over 5m, 1h` (multi-window burn rate),
  each evaluated on the newest window (burn: on the last windows covering each span).

A window [t, t + w) is evaluated at t + w + delay and sees the requests that started in it
and ended by then: a live watch (`run_live`) and a backtest (`replay`) see the same rows,
so the replay prints exactly what the live watch would have fired. Percentiles follow the
project convention (`quantile_cont`, failures included); each alert carries its counts.
Sampled traces: each request weighs its adjusted count (`adjusted_count`) in the spike
detection, the rule percentiles (analysis.engine.percentiles' weighted quantile, low-sample on the
effective count), the error rate and the burn rate; where every weight is 1 the unweighted
computation runs, bit for bit.

Cost per tick is independent of the store's history: a tick reads only the hour partitions
holding the new window (`open_range`); the baseline is the in-memory buffer, rebuilt from a
bounded lookback after a restart. Alert state lives in STORE/alerts/ (`AlertStore`, written
temp-then-rename), so a restarted watch neither repeats a fire nor loses a resolve.

The modules, one per concern: `rules` (the rules file), `reading` (the hours a range needs),
`records` (configuration, events, ids, links), `evaluation` (`Watcher`), `state` (STORE/alerts/),
`replay`, `live` (`LiveWatch`, the stdout line) and `delivery` (webhooks and Alertmanager, the outbox).
"""

from analysis.watch.delivery import Deliverer, Outbox, Receiver, receivers_from
from analysis.watch.evaluation import Watcher, evaluate_rule, weights_of_rows
from analysis.watch.live import LiveWatch, summary_line
from analysis.watch.reading import open_range, read_rows, segment_files_between
from analysis.watch.records import ALERT_VERSION, ALERTS_DIR, Config, Event, alert_id, spike_url
from analysis.watch.replay import replay, replay_json
from analysis.watch.rules import WATCH_METRICS, Rule, load_rules, parse_rule, parse_rules
from analysis.watch.state import AlertStore, alerts_frame, list_alerts

__all__ = ["ALERTS_DIR", "ALERT_VERSION", "WATCH_METRICS", "AlertStore", "Config", "Deliverer", "Event",
           "LiveWatch", "Outbox", "Receiver", "Rule", "Watcher", "alert_id", "alerts_frame", "evaluate_rule",
           "list_alerts", "load_rules", "open_range", "parse_rule", "parse_rules", "read_rows", "receivers_from",
           "replay", "replay_json", "segment_files_between", "spike_url", "summary_line", "weights_of_rows"]
