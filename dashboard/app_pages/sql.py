"""SQL: a read-only console over the documented views (spans, requests, stages)."""

from __future__ import annotations

import duckdb
import streamlit as st

from dashboard import clickhouse_data, data
from tracing.errors import QueryError

db = data.open_store()
st.title("SQL")
if isinstance(db, clickhouse_data.ClickHouseBench):
    examples = clickhouse_data.SQL_EXAMPLES
    st.caption("One ClickHouse SELECT (or WITH … SELECT) over `spans`, `requests`, `stages`, computed from "
               f"`{db.table}` (see docs/scale-out.md). It runs with readonly = 1: no writes, no DDL, no setting "
               f"changes; the server stops it after {data.SQL_TIMEOUT_S:g} s. Sidebar filters do not apply here.")
else:
    examples = data.SQL_EXAMPLES
    st.caption("One SELECT (or WITH … SELECT) over the views `spans`, `requests`, `stages` (see docs/schema.md). "
               f"The console reads only the store: no files, no network, no COPY/ATTACH/INSTALL; a query running "
               f"past {data.SQL_TIMEOUT_S:g} s is interrupted. Sidebar filters do not apply here.")
example = st.selectbox("Examples", ["(write your own)", *examples], key="sql_example")
if example in examples and st.session_state.get("_sql_example_shown") != example:
    st.session_state["sql_text"] = examples[example]
    st.session_state["_sql_example_shown"] = example
query = st.text_area("Query", key="sql_text", height=160,
                     value=None if "sql_text" in st.session_state else examples["p50 / p99 per replica"])
if st.button("Run", type="primary", key="sql_run") or st.session_state.get("sql_autorun"):
    try:
        if isinstance(db, clickhouse_data.ClickHouseBench):
            result, truncated = clickhouse_data.run_sql(db, query or "", data.SQL_TIMEOUT_S, data.SQL_ROW_LIMIT)
        else:
            result, truncated = data.run_sql(str(db.store), query or "")
    except data.RefusedQuery as exc:
        st.error(f"Refused: {exc}")
    except TimeoutError as exc:
        st.error(str(exc))
    except duckdb.Error as exc:
        st.error(f"Query failed: {str(exc).splitlines()[0]}")
    except QueryError as exc:  # ClickHouse refused or failed it (readonly = 1, a timeout, a syntax error)
        st.error(f"Query failed: {str(exc).splitlines()[0]}")
    else:
        st.dataframe(result, hide_index=True)
        st.caption(f"{len(result):,} row(s)" + (f"; only the first {data.SQL_ROW_LIMIT:,} shown" if truncated else ""))
