"""The dashboard's pages, run by the router (dashboard/app.py) through st.navigation.

Not named `pages/`: a `pages/` directory beside the entrypoint switches Streamlit to its
older pages-directory mode, under which AppTest reruns run a page without the router.
"""
