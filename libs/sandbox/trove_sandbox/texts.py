"""Hand-written natural-language text for the sandbox pages, one block per language.

Each language has eight sentences on the same everyday topics (so pages in
different languages read alike), eight matching topics for titles, and the words
a small personal site uses around them. Pages combine five to seven sentences,
which is enough (over 60 words) for a language detector to be confident.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class LanguageText:
    """Everything a page in one language says, so no page mixes two languages."""

    code: str
    sentences: tuple[str, ...]
    topics: tuple[str, ...]
    part: str
    home: str
    newer: str
    older: str
    related: str
    elsewhere: str
    blogroll: str
    feed: str
    drafts: str
    private: str
    contact: str
    comments: str
    site_intro: str


TEXTS: dict[str, LanguageText] = {
    "en": LanguageText(
        code="en",
        sentences=(
            "Every morning I walk along the river before the town wakes up, and the herons"
            " are always there first.",
            "The old bakery on the corner still makes bread the slow way, with a starter that"
            " is older than I am.",
            "I have been keeping this small website for years because I like writing without"
            " anyone counting the clicks.",
            "Last weekend we repaired a bicycle with parts from three different decades, and"
            " somehow it rides beautifully.",
            "My grandmother taught me that a garden is never finished, only paused until the"
            " next spring.",
            "When the library closes early on Saturdays, I read in the park and watch the"
            " pigeons argue about crumbs.",
            "There is a quiet pleasure in reading a long letter from a friend who still writes"
            " by hand.",
            "The train to the coast takes four hours, which is exactly enough time to finish a"
            " good novel.",
        ),
        topics=(
            "Morning walks by the river",
            "The bakery on the corner",
            "Why I keep this website",
            "Repairing an old bicycle",
            "What my grandmother knew about gardens",
            "Saturdays in the park",
            "Letters written by hand",
            "Four hours on the coastal train",
        ),
        part="part",
        home="Home",
        newer="Newer post",
        older="Older post",
        related="You might also like",
        elsewhere="Elsewhere on the small web",
        blogroll="Friends and neighbours",
        feed="Subscribe to the feed",
        drafts="Unfinished drafts",
        private="My private diary",
        contact="Write to me",
        comments="Comments",
        site_intro="Welcome to my corner of the web, where I write about ordinary days.",
    ),
    "fr": LanguageText(
        code="fr",
        sentences=(
            "Chaque matin, je me promène le long de la rivière avant que la ville ne se"
            " réveille, et les hérons sont toujours là les premiers.",
            "La vieille boulangerie du coin fait encore le pain à l'ancienne, avec un levain"
            " plus âgé que moi.",
            "Je tiens ce petit site depuis des années parce que j'aime écrire sans que"
            " personne ne compte les clics.",
            "Le week-end dernier, nous avons réparé un vélo avec des pièces de trois décennies"
            " différentes, et il roule à merveille.",
            "Ma grand-mère m'a appris qu'un jardin n'est jamais terminé, seulement mis en"
            " pause jusqu'au printemps suivant.",
            "Quand la bibliothèque ferme tôt le samedi, je lis dans le parc et je regarde les"
            " pigeons se disputer les miettes.",
            "Il y a un plaisir discret à lire une longue lettre d'une amie qui écrit encore à"
            " la main.",
            "Le train pour la côte met quatre heures, ce qui laisse exactement le temps de"
            " finir un bon roman.",
        ),
        topics=(
            "Balades matinales au bord de la rivière",
            "La boulangerie du coin",
            "Pourquoi je garde ce site",
            "Réparer un vieux vélo",
            "Ce que ma grand-mère savait des jardins",
            "Les samedis au parc",
            "Des lettres écrites à la main",
            "Quatre heures dans le train de la côte",
        ),
        part="partie",
        home="Accueil",
        newer="Billet plus récent",
        older="Billet plus ancien",
        related="À lire aussi",
        elsewhere="Ailleurs sur le petit web",
        blogroll="Amis et voisins",
        feed="S'abonner au flux",
        drafts="Brouillons inachevés",
        private="Mon journal intime",
        contact="M'écrire",
        comments="Commentaires",
        site_intro="Bienvenue dans mon coin du web, où je raconte des journées ordinaires.",
    ),
    "de": LanguageText(
        code="de",
        sentences=(
            "Jeden Morgen gehe ich am Fluss entlang, bevor die Stadt aufwacht, und die Reiher"
            " sind immer schon vor mir da.",
            "Die alte Bäckerei an der Ecke backt ihr Brot noch immer langsam, mit einem"
            " Sauerteig, der älter ist als ich.",
            "Ich pflege diese kleine Webseite seit Jahren, weil ich gerne schreibe, ohne dass"
            " jemand die Klicks zählt.",
            "Letztes Wochenende haben wir ein Fahrrad mit Teilen aus drei verschiedenen"
            " Jahrzehnten repariert, und es fährt wunderbar.",
            "Meine Großmutter hat mir beigebracht, dass ein Garten nie fertig ist, sondern nur"
            " bis zum nächsten Frühling ruht.",
            "Wenn die Bibliothek am Samstag früher schließt, lese ich im Park und schaue den"
            " Tauben beim Streit um Krümel zu.",
            "Es ist eine stille Freude, einen langen Brief von einer Freundin zu lesen, die"
            " noch mit der Hand schreibt.",
            "Der Zug an die Küste braucht vier Stunden, und das ist genau die Zeit, die man für"
            " einen guten Roman braucht.",
        ),
        topics=(
            "Morgenspaziergänge am Fluss",
            "Die Bäckerei an der Ecke",
            "Warum ich diese Webseite pflege",
            "Ein altes Fahrrad reparieren",
            "Was meine Großmutter über Gärten wusste",
            "Samstage im Park",
            "Briefe von Hand geschrieben",
            "Vier Stunden im Zug an die Küste",
        ),
        part="Teil",
        home="Startseite",
        newer="Neuerer Beitrag",
        older="Älterer Beitrag",
        related="Das könnte dich auch interessieren",
        elsewhere="Anderswo im kleinen Netz",
        blogroll="Freunde und Nachbarn",
        feed="Den Feed abonnieren",
        drafts="Unfertige Entwürfe",
        private="Mein privates Tagebuch",
        contact="Schreib mir",
        comments="Kommentare",
        site_intro="Willkommen in meiner Ecke des Netzes, wo ich über ganz normale Tage schreibe.",
    ),
    "es": LanguageText(
        code="es",
        sentences=(
            "Cada mañana camino junto al río antes de que el pueblo despierte, y las garzas"
            " siempre llegan primero.",
            "La vieja panadería de la esquina todavía hace el pan despacio, con una masa madre"
            " más antigua que yo.",
            "Llevo años cuidando esta pequeña página porque me gusta escribir sin que nadie"
            " cuente los clics.",
            "El fin de semana pasado arreglamos una bicicleta con piezas de tres décadas"
            " distintas, y anda de maravilla.",
            "Mi abuela me enseñó que un jardín nunca está terminado, solo descansa hasta la"
            " próxima primavera.",
            "Cuando la biblioteca cierra temprano los sábados, leo en el parque y miro a las"
            " palomas pelearse por las migas.",
            "Hay un placer tranquilo en leer una carta larga de una amiga que todavía escribe"
            " a mano.",
            "El tren hacia la costa tarda cuatro horas, que es justo el tiempo necesario para"
            " terminar una buena novela.",
        ),
        topics=(
            "Paseos matinales junto al río",
            "La panadería de la esquina",
            "Por qué mantengo esta página",
            "Arreglar una bicicleta vieja",
            "Lo que mi abuela sabía de jardines",
            "Los sábados en el parque",
            "Cartas escritas a mano",
            "Cuatro horas en el tren de la costa",
        ),
        part="parte",
        home="Inicio",
        newer="Entrada más reciente",
        older="Entrada anterior",
        related="También te puede interesar",
        elsewhere="En otros rincones de la pequeña web",
        blogroll="Amigos y vecinos",
        feed="Suscribirse al canal",
        drafts="Borradores sin terminar",
        private="Mi diario privado",
        contact="Escríbeme",
        comments="Comentarios",
        site_intro="Bienvenido a mi rincón de la web, donde escribo sobre días corrientes.",
    ),
    "nl": LanguageText(
        code="nl",
        sentences=(
            "Elke ochtend wandel ik langs de rivier voordat de stad wakker wordt, en de reigers"
            " zijn er altijd eerder dan ik.",
            "De oude bakkerij op de hoek bakt het brood nog steeds op de langzame manier, met"
            " een zuurdesem die ouder is dan ik.",
            "Ik houd deze kleine website al jaren bij, omdat ik graag schrijf zonder dat iemand"
            " de kliks telt.",
            "Vorig weekend hebben we een fiets gerepareerd met onderdelen uit drie verschillende"
            " decennia, en hij rijdt prachtig.",
            "Mijn oma leerde me dat een tuin nooit af is, alleen even rust tot het volgende"
            " voorjaar.",
            "Als de bibliotheek op zaterdag vroeg sluit, lees ik in het park en kijk ik hoe de"
            " duiven om kruimels ruziën.",
            "Het is een stil genoegen om een lange brief te lezen van een vriendin die nog met"
            " de hand schrijft.",
            "De trein naar de kust doet er vier uur over, precies genoeg tijd om een goede"
            " roman uit te lezen.",
        ),
        topics=(
            "Ochtendwandelingen langs de rivier",
            "De bakkerij op de hoek",
            "Waarom ik deze website bijhoud",
            "Een oude fiets repareren",
            "Wat mijn oma wist over tuinen",
            "Zaterdagen in het park",
            "Brieven met de hand geschreven",
            "Vier uur in de trein naar de kust",
        ),
        part="deel",
        home="Startpagina",
        newer="Nieuwer bericht",
        older="Ouder bericht",
        related="Misschien vind je dit ook leuk",
        elsewhere="Elders op het kleine web",
        blogroll="Vrienden en buren",
        feed="Abonneer je op de feed",
        drafts="Onafgemaakte concepten",
        private="Mijn privédagboek",
        contact="Schrijf me",
        comments="Reacties",
        site_intro="Welkom in mijn hoekje van het web, waar ik over gewone dagen schrijf.",
    ),
    "it": LanguageText(
        code="it",
        sentences=(
            "Ogni mattina passeggio lungo il fiume prima che la città si svegli, e gli aironi"
            " sono sempre lì per primi.",
            "Il vecchio forno all'angolo fa ancora il pane con calma, usando un lievito madre"
            " più vecchio di me.",
            "Curo questo piccolo sito da anni perché mi piace scrivere senza che nessuno conti"
            " i clic.",
            "Lo scorso fine settimana abbiamo riparato una bicicletta con pezzi di tre decenni"
            " diversi, e va benissimo.",
            "Mia nonna mi ha insegnato che un giardino non è mai finito, ma soltanto in pausa"
            " fino alla prossima primavera.",
            "Quando la biblioteca chiude presto il sabato, leggo nel parco e guardo i piccioni"
            " litigare per le briciole.",
            "C'è un piacere tranquillo nel leggere una lunga lettera di un'amica che scrive"
            " ancora a mano.",
            "Il treno per la costa impiega quattro ore, che è proprio il tempo giusto per"
            " finire un buon romanzo.",
        ),
        topics=(
            "Passeggiate mattutine lungo il fiume",
            "Il forno all'angolo",
            "Perché curo questo sito",
            "Riparare una vecchia bicicletta",
            "Quello che mia nonna sapeva dei giardini",
            "I sabati al parco",
            "Lettere scritte a mano",
            "Quattro ore sul treno della costa",
        ),
        part="parte",
        home="Pagina iniziale",
        newer="Articolo più recente",
        older="Articolo precedente",
        related="Potrebbe interessarti anche",
        elsewhere="Altrove nel piccolo web",
        blogroll="Amici e vicini",
        feed="Iscriviti al feed",
        drafts="Bozze non finite",
        private="Il mio diario privato",
        contact="Scrivimi",
        comments="Commenti",
        site_intro="Benvenuti nel mio angolo del web, dove scrivo di giornate qualunque.",
    ),
}

#: The order in which generated hosts take their language.
LANGUAGE_ORDER: tuple[str, ...] = ("en", "fr", "de", "es", "nl", "it")

#: Readable owner-and-topic host labels, in order; more hosts reuse them with a number.
HOST_LABELS: tuple[str, ...] = (
    "alice-blog",
    "bob-notes",
    "carol-garden",
    "dave-bikes",
    "erin-recipes",
    "frank-rails",
    "grace-letters",
    "heidi-maps",
    "ivan-radio",
    "judy-books",
    "mallory-walks",
    "oscar-photos",
)
