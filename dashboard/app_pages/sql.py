"""SQL: a read-only console over the documented views (spans, requests, stages)."""

from __future__ import annotations

import duckdb
import streamlit as st

from dashboard import data

db = data.open_store()
st.title("SQL")
st.caption("One SELECT (or WITH … SELECT) over the views `spans`, `requests`, `stages` (see docs/schema.md). "
           f"The console reads only the store: no files, no network, no COPY/ATTACH/INSTALL; a query running "
           f"past {data.SQL_TIMEOUT_S:g} s is interrupted. Sidebar filters do not apply here.")
example = st.selectbox("Examples", ["(write your own)", *data.SQL_EXAMPLES], key="sql_example")
if example in data.SQL_EXAMPLES and st.session_state.get("_sql_example_shown") != example:
    st.session_state["sql_text"] = data.SQL_EXAMPLES[example]
    st.session_state["_sql_example_shown"] = example
query = st.text_area("Query", key="sql_text", height=160,
                     value=None if "sql_text" in st.session_state else data.SQL_EXAMPLES["p50 / p99 per replica"])
if st.button("Run", type="primary", key="sql_run") or st.session_state.get("sql_autorun"):
    try:
        result, truncated = data.run_sql(str(db.store), query or "")
    except data.RefusedQuery as exc:
        st.error(f"Refused: {exc}")
    except TimeoutError as exc:
        st.error(str(exc))
    except duckdb.Error as exc:
        st.error(f"Query failed: {str(exc).splitlines()[0]}")
    else:
        st.dataframe(result, hide_index=True)
        st.caption(f"{len(result):,} row(s)" + (f"; only the first {data.SQL_ROW_LIMIT:,} shown" if truncated else ""))
