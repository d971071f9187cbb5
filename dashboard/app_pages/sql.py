"""SQL: a read-only console over the documented views (spans, requests, stages)."""

from __future__ import annotations

import duckdb
import streamlit as st

from dashboard import data
from tracing.errors import QueryError

db = data.open_store()
st.title("SQL")
caption, examples = db.sql_help()
st.caption(caption)
example = st.selectbox("Examples", ["(write your own)", *examples], key="sql_example")
if example in examples and st.session_state.get("_sql_example_shown") != example:
    st.session_state["sql_text"] = examples[example]
    st.session_state["_sql_example_shown"] = example
query = st.text_area("Query", key="sql_text", height=160,
                     value=None if "sql_text" in st.session_state else examples["p50 / p99 per replica"])
if st.button("Run", type="primary", key="sql_run") or st.session_state.get("sql_autorun"):
    try:
        result, truncated = db.run_sql(query or "", data.SQL_TIMEOUT_S, data.SQL_ROW_LIMIT)
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
