"""The Textual face of cachemgr. Imports cachemgr; cachemgr never imports this package."""
